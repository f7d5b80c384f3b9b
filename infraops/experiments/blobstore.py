"""Where probe outputs (blobs) are kept: every reader and writer in the product goes through
`blob_store()`, never through a folder of its own.

On the web's host (and a worker that shares its data folder) the store is Django's storage
STORAGES["blobs"]: by default the files under <data>/blobs, named "<sha256[:2]>/<sha256>" as
they always were; INFRAOPS_BLOB_STORAGE may name another backend (an S3-compatible store
through django-storages). A worker on another host (settings.WEB_URL set) reads and writes
them over HTTPS instead (infraops.experiments.remote.RemoteBlobStore, the worker side).

Contracts:
- A blob is never visible half written: a local store renames a finished temporary file into
  place; a remote storage publishes an object only once it is whole.
- `open` and `local_path` raise `BlobMissing` (a FileNotFoundError, so readers that already
  treat an unreadable file as "no data" keep doing so).
- `local_path` gives a readable file on this machine: the storage's own file when it keeps
  files here (a FileSystemStorage), else a verified copy in <data>/blob-cache.
"""

from __future__ import annotations

import hashlib
import importlib
import shutil
import tempfile
from pathlib import Path
from typing import BinaryIO, Protocol, cast

from django.conf import settings
from django.core.files import File
from django.core.files.storage import FileSystemStorage, Storage, storages

from infraops.experiments.blobs import CHUNK, blob_path, blob_put


class BlobMissing(FileNotFoundError):
    """No blob with this sha256 is in the store."""


class BlobStore(Protocol):
    def put(self, source: Path) -> tuple[str, int]:
        """Store the file's content (once per content); return (sha256, size)."""
        ...

    def exists(self, sha256: str) -> bool: ...

    def open(self, sha256: str) -> BinaryIO:
        """The blob's bytes, for reading; raises BlobMissing."""
        ...

    def local_path(self, sha256: str) -> Path:
        """A readable file on this machine holding the blob; raises BlobMissing."""
        ...


def blob_name(sha256: str) -> str:
    """The blob's name in a storage: "<sha256[:2]>/<sha256>" (ValueError for a non-sha256)."""
    return blob_path(Path(), sha256).as_posix()


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


class StorageBlobStore:
    """Blobs in a Django storage (STORAGES["blobs"] unless one is given)."""

    def __init__(self, storage: Storage | None = None) -> None:
        self.storage = storage if storage is not None else storages["blobs"]

    def _root(self) -> Path | None:
        """The storage's folder on this machine, or None for a storage without local files.
        Only a file system storage counts: others may answer path() with a folder that holds
        nothing (Django's InMemoryStorage does)."""
        if isinstance(self.storage, FileSystemStorage):
            return Path(self.storage.path(""))
        return None

    def put(self, source: Path) -> tuple[str, int]:
        root = self._root()
        if root is not None:
            return blob_put(root, source)  # temporary file, then an atomic rename
        sha256 = file_sha256(source)
        if not self.storage.exists(blob_name(sha256)):
            with source.open("rb") as handle:
                self.storage.save(blob_name(sha256), File(handle))
        return sha256, source.stat().st_size

    def exists(self, sha256: str) -> bool:
        return bool(self.storage.exists(blob_name(sha256)))

    def open(self, sha256: str) -> BinaryIO:
        name = blob_name(sha256)
        try:
            handle = self.storage.open(name, "rb")
        except FileNotFoundError:
            raise BlobMissing(f"no blob {sha256} in the blob store") from None
        return handle  # type: ignore[return-value]  # a File proxies a binary file

    def local_path(self, sha256: str) -> Path:
        root = self._root()
        if root is not None:
            path = blob_path(root, sha256)
            if not path.is_file():
                raise BlobMissing(f"no blob {sha256} in the blob store")
            return path
        return self._cached(sha256)

    def _cached(self, sha256: str) -> Path:
        """A verified copy in <data>/blob-cache, written once (renamed into place whole)."""
        path = blob_path(Path(settings.DATA_DIR) / "blob-cache", sha256)
        if path.is_file():
            return path
        path.parent.mkdir(parents=True, exist_ok=True)
        with self.open(sha256) as source, tempfile.NamedTemporaryFile(
                dir=path.parent, delete=False) as copy:
            try:
                shutil.copyfileobj(source, copy, CHUNK)
                copy.close()
                if file_sha256(Path(copy.name)) != sha256:
                    raise BlobMissing(f"blob {sha256} read back with other content")
                Path(copy.name).replace(path)
            except BaseException:
                Path(copy.name).unlink(missing_ok=True)
                raise
        return path


def blob_store() -> BlobStore:
    """The store this process uses: the web's storage, or over HTTPS on a remote worker."""
    if settings.WEB_URL:
        # The worker side's module, imported only where it is used.
        remote = importlib.import_module("infraops.experiments.remote")
        return cast(BlobStore, remote.RemoteBlobStore())
    return StorageBlobStore()
