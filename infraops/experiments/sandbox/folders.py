"""The host folders a sandbox writes (its work tree and output folder, handed to its uid
beforehand) and the files read back from them afterwards, never trusting what the probe left."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from infraops.experiments.sandbox.config import SandboxIdentity, SandboxUnavailable


def sandbox_prepare_dir(path: Path, identity: SandboxIdentity) -> None:
    """Make path (recursively) writable by the sandbox identity (chown when we are root).

    Creates path if missing. A top-level ``.git`` is left alone: it is bound read-only inside and
    host-side git must keep owning it. Symlinks are changed, never followed. Raises
    SandboxUnavailable when a parent folder is not searchable by the identity (bwrap, running
    as that uid, could not bind path)."""
    path.mkdir(parents=True, exist_ok=True)
    _require_searchable_parents(path, identity)
    for entry in _tree_entries(path):
        if os.geteuid() == 0:
            os.chown(entry, identity.uid, identity.gid, follow_symlinks=False)
        else:
            _make_owner_writable(entry)


def _require_searchable_parents(path: Path, identity: SandboxIdentity) -> None:
    for parent in path.resolve().parents:
        info = parent.stat()
        if info.st_uid == identity.uid:
            bit = stat.S_IXUSR
        elif info.st_gid == identity.gid:
            bit = stat.S_IXGRP
        else:
            bit = stat.S_IXOTH
        if not info.st_mode & bit:
            raise SandboxUnavailable(
                f"The folder {parent} is not searchable by uid {identity.uid}, so the sandbox "
                f"cannot reach {path}: allow it (chmod o+x {parent}) or move the data folder."
            )


def _tree_entries(root: Path) -> list[Path]:
    """root and everything below it except a top-level .git, without following symlinks."""
    entries = [root]
    for folder, dirs, files in os.walk(root):
        if Path(folder) == root:
            dirs[:] = [name for name in dirs if name != ".git"]
            files = [name for name in files if name != ".git"]
        entries.extend(Path(folder, name) for name in (*dirs, *files))
    return entries


def _make_owner_writable(entry: Path) -> None:
    info = entry.lstat()
    if stat.S_ISLNK(info.st_mode) or info.st_uid != os.geteuid():
        return
    wanted = stat.S_IRUSR | stat.S_IWUSR
    if stat.S_ISDIR(info.st_mode):
        wanted |= stat.S_IXUSR
    entry.chmod(stat.S_IMODE(info.st_mode) | wanted)


def give_back_owner_bits(root: Path) -> None:
    """Not root: the owner's read and write bits (and search, on folders) on everything below
    root this uid owns, each folder before it is entered (a run as this uid may have taken them
    away from what it left)."""
    if os.geteuid() == 0:
        return
    _make_owner_writable(root)
    for folder, dirs, files in os.walk(root):
        for name in (*dirs, *files):
            _make_owner_writable(Path(folder, name))


def sandbox_read_output(out_dir: Path, name: str, *, max_bytes: int) -> bytes | None:
    """Up to max_bytes of the regular file ``out_dir/name`` written by a probe.

    The probe owns out_dir, so it may plant a symlink to a host file or a FIFO there: the file is
    opened without following symlinks and without blocking, and must be regular. name is one
    path component. Returns None when the file does not exist; raises ValueError for a name
    with a separator and OSError for anything that is not a regular file."""
    if not name or "/" in name or name in {".", ".."}:
        raise ValueError(f"{name!r} is not a single file name.")
    folder = os.open(out_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        handle = os.open(name, flags, dir_fd=folder)
    except FileNotFoundError:
        return None
    finally:
        os.close(folder)
    with os.fdopen(handle, "rb") as file:
        if not stat.S_ISREG(os.fstat(handle).st_mode):
            raise OSError(errno.EINVAL, f"{name} in the probe's output is not a regular file")
        return file.read(max_bytes)
