"""A content-addressed file store: <root>/<sha256[:2]>/<sha256>. Pure filesystem, no Django.

Identical outputs (the same reference array from every repeat) are stored once.
"""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

CHUNK = 1 << 20


def blob_path(root: Path, sha256: str) -> Path:
    if len(sha256) != 64 or not all(c in "0123456789abcdef" for c in sha256):
        raise ValueError(f"not a sha256: {sha256!r}")
    return root / sha256[:2] / sha256


def blob_put(root: Path, source: Path) -> tuple[str, int]:
    """Copy `source` into the store (once per content); return (sha256, size)."""
    root.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    size = 0
    with tempfile.NamedTemporaryFile(dir=root, delete=False) as tmp:
        try:
            with source.open("rb") as handle:
                while chunk := handle.read(CHUNK):
                    digest.update(chunk)
                    tmp.write(chunk)
                    size += len(chunk)
            tmp.flush()
            final = blob_path(root, digest.hexdigest())
            final.parent.mkdir(exist_ok=True)
            if final.exists():
                Path(tmp.name).unlink()
            else:
                Path(tmp.name).replace(final)  # atomic: readers never see half a blob
        except BaseException:
            Path(tmp.name).unlink(missing_ok=True)
            raise
    return digest.hexdigest(), size
