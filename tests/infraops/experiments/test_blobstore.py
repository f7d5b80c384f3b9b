"""infraops/experiments/blobstore.py: the blob store every reader and writer goes through. On
one host it keeps today's files (<data>/blobs/<sha[:2]>/<sha>); a storage without local
files is read through a verified cache."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from django.conf import settings
from django.core.files.storage import InMemoryStorage

from infraops.experiments.blobs import blob_path, blob_put
from infraops.experiments.blobstore import BlobMissing, StorageBlobStore, blob_store


def a_file(tmp_path: Path, content: bytes = b"outputs\n" * 1000) -> Path:
    path = tmp_path / "source.bin"
    path.write_bytes(content)
    return path


def test_one_host_keeps_the_blobs_where_they_always_were(tmp_path: Path) -> None:
    source = a_file(tmp_path)

    sha, size = blob_store().put(source)

    assert (sha, size) == (hashlib.sha256(source.read_bytes()).hexdigest(), 8000)
    assert blob_path(Path(settings.DATA_DIR) / "blobs", sha).read_bytes() == source.read_bytes()
    assert blob_store().local_path(sha) == Path(settings.DATA_DIR) / "blobs" / sha[:2] / sha


def test_a_blob_written_before_the_store_existed_is_read_through_it(tmp_path: Path) -> None:
    sha, _ = blob_put(Path(settings.DATA_DIR) / "blobs", a_file(tmp_path, b"old data"))

    store = blob_store()

    assert store.exists(sha)
    with store.open(sha) as handle:
        assert handle.read() == b"old data"


def test_a_missing_blob_is_blob_missing_a_file_not_found_error() -> None:
    missing = "0" * 64
    store = blob_store()

    assert not store.exists(missing)
    with pytest.raises(BlobMissing):
        store.open(missing)
    with pytest.raises(FileNotFoundError):
        store.local_path(missing)


def test_a_name_that_is_not_a_sha256_is_refused() -> None:
    with pytest.raises(ValueError, match="not a sha256"):
        blob_store().exists("../../etc/passwd")


def test_a_storage_without_local_files_is_read_through_a_verified_cache(tmp_path: Path) -> None:
    store = StorageBlobStore(InMemoryStorage())
    sha, _ = store.put(a_file(tmp_path, b"far away"))

    path = store.local_path(sha)

    assert path == Path(settings.DATA_DIR) / "blob-cache" / sha[:2] / sha
    assert path.read_bytes() == b"far away"
    assert store.put(a_file(tmp_path, b"far away"))[0] == sha  # stored once
    assert [p.name for p in path.parent.iterdir()] == [sha]  # no temporary file left


def test_a_remote_worker_uses_the_remote_store(settings: object,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    import types

    remote = types.ModuleType("infraops.experiments.remote")

    class RemoteBlobStore:
        pass

    remote.RemoteBlobStore = RemoteBlobStore  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "infraops.experiments.remote", remote)
    settings.WEB_URL = "https://infraops.example"  # type: ignore[attr-defined]

    assert isinstance(blob_store(), RemoteBlobStore)
