"""The disk a run writes, as a file system of its own (:class:`_Scratch`): a tmpfs mounted for
the run with ``size=`` its disk_mb and ``nr_inodes=`` its inodes, holding an overlay's upper
layer over the work tree (bound at /work) and the output folder (bound at /out). The kernel
refuses the first write past either limit, so there is nothing for a probe to outrun: the
meter that walked the two folders had to stop somewhere (500,000 entries), and a probe that made
more entries than that first wrote what it liked behind them.

Why this and not the alternatives. A file-system quota (ext4 ``prjquota``, xfs ``pquota``) must
be switched on when the data folder's file system is mounted, which this product cannot ask of
every host. A scratch image per run costs a mkfs and a loop device at every start, over the
50 ms a start may take (row S9). A tmpfs costs memory instead of disk: its pages are charged to
the run's memory control group, so the run's memory_mb bounds its files and its processes
together (the kernel kills the run at that limit, as for any memory), and without a memory
group the tmpfs's own size still bounds it; the whole of it is freed when the run ends.

Why an inode limit of its own: a tmpfs file costs no block but a kernel inode and dentry (about
1 KiB each, charged to the run as well), and every file a run leaves is walked on the host
afterwards (the copy back below, the files-left-behind check, the artifacts): a count, not
bytes, is what bounds that work.

After the run, what it changed in its work tree (the upper layer: new and changed files,
whiteouts for deleted ones) and wrote to its output folder is copied onto the host folders, so
the next execution of the experiment finds them as before; a run whose spec says not to keep
its work tree (``keep_workdir``) has only its output copied. Runs as root only (mounts); a
sandbox started by another user keeps the walking meter (disk.py), and a run that keeps no work
tree then runs on a throwaway copy of it (:func:`throwaway_workdir`).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import itertools
import logging
import os
import shutil
import stat
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final

from infraops.experiments.sandbox.config import SandboxSpec, SandboxUnavailable
from infraops.experiments.sandbox.folders import give_back_owner_bits
from infraops.experiments.sandbox.mounts import _etc_parent

log = logging.getLogger("infraops.experiments.sandbox")

_MS_NOSUID: Final = 2
_MS_NODEV: Final = 4
_MS_REMOUNT: Final = 32
_MNT_DETACH: Final = 2
# Room for the tmpfs's own entries (its root, upper/, work/, merged/, out/ and what the overlay
# makes in work/) until the inode limit is set to exactly the run's own.
_SETUP_INODES: Final = 64
_OPAQUE: Final = "trusted.overlay.opaque"
_KEPT_MODE_BITS: Final = 0o1777  # setuid and setgid bits never reach the host

_libc = ctypes.CDLL(None, use_errno=True)
_serial = itertools.count()
_refused: list[str] = []  # why the first mount failed, in this process


def scratch_available() -> bool:
    """Whether runs here get a scratch: as root, until a mount has been refused."""
    return os.geteuid() == 0 and not _refused


@dataclass(frozen=True)
class _Usage:
    """What the run has written so far: bytes and files, and whether either limit is reached
    (the kernel then refuses the next write)."""

    bytes: int
    files: int
    bytes_full: bool
    files_full: bool


class _Scratch:
    """One run's sized tmpfs: the overlay at ``merged`` (the run's /work) and ``out`` (its
    /out). :meth:`keep` copies what the run left onto the host folders; :meth:`remove`
    unmounts it all."""

    def __init__(self, root: Path, spec: SandboxSpec) -> None:
        self.root = root
        self.spec = spec
        self.upper, self.merged, self.out = root / "upper", root / "merged", root / "out"

    @classmethod
    def make(cls, spec: SandboxSpec) -> _Scratch | None:
        """Mount the run's scratch, or None where this process cannot mount: not root, or
        refused (a container without the capability, a kernel without overlay), which is
        logged once; the run then has the meter, as control groups degrade (cgroups.py)."""
        if not scratch_available():
            return None
        parent = _scratch_parent()
        root = parent / f"r{os.getpid()}-{next(_serial)}"
        root.mkdir(mode=0o755)
        scratch = cls(root, spec)
        try:
            scratch._mount()
        except OSError as exc:
            scratch.remove()
            _refused.append(f"{exc.strerror or exc}")
            log.warning("sandbox disk scratch (tmpfs and overlay) cannot be mounted here (%s): "
                        "the disk limit is measured instead, and the inode limit is not held",
                        _refused[0])
            return None
        return scratch

    def _mount(self) -> None:
        size = f"size={self.spec.limits.disk_mb << 20}"
        _mount("tmpfs", self.root, "tmpfs", f"{size},nr_inodes={_SETUP_INODES},mode=0755")
        for folder in ("upper", "work", "merged", "out"):
            (self.root / folder).mkdir(mode=0o700)
        _same_owner_and_mode(self.upper, self.spec.workdir)
        _same_owner_and_mode(self.out, self.spec.out_dir)
        # The lower folder by descriptor: a path with "," or ":" would break the options.
        lower = os.open(self.spec.workdir, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            _mount("overlay", self.merged, "overlay",
                   f"lowerdir=/proc/self/fd/{lower},upperdir={self.upper},"
                   f"workdir={self.root / 'work'},redirect_dir=off,index=off,metacopy=off,"
                   "xino=off")
        finally:
            os.close(lower)
        made = os.statvfs(self.root)
        own = made.f_files - made.f_ffree
        _mount("tmpfs", self.root, "tmpfs",
               f"{size},nr_inodes={own + self.spec.limits.inodes}", _MS_REMOUNT)
        self.base = os.statvfs(self.root)

    def inside(self) -> SandboxSpec:
        """The spec bwrap is given: the overlay as the work tree, the scratch's out folder."""
        return replace(self.spec, workdir=self.merged, out_dir=self.out)

    def usage(self) -> _Usage:
        now = os.statvfs(self.root)
        return _Usage(
            bytes=(self.base.f_bfree - now.f_bfree) * now.f_frsize,
            files=self.base.f_ffree - now.f_ffree,
            bytes_full=now.f_bfree == 0, files_full=now.f_ffree == 0,
        )

    def keep(self) -> int:
        """Copy what the run wrote to its output, and what it changed in its work tree unless
        its spec says not to keep that, onto the host folders (once nothing of the run is
        left); returns how many entries could not be copied (a path too long for the host, a
        name the host refuses). Raises OSError when the host's disk is full."""
        missed = _apply_layer(self.upper, self.spec.workdir) if self.spec.keep_workdir else 0
        return missed + _apply_layer(self.out, self.spec.out_dir)

    def remove(self) -> None:
        _unmount(self.root)


def throwaway_workdir(workdir: Path) -> Path:
    """A copy of workdir beside it (owners, modes and times kept), for a run whose work tree
    is not to be kept where no scratch can be mounted; the caller removes it (remove_throwaway).
    Not root, the sandbox runs as this uid and may have taken its own read bits away from what
    it left: they are given back first, as sandbox_prepare_dir does."""
    give_back_owner_bits(workdir)
    copy = workdir.parent / f".{workdir.name}.run-{os.getpid()}-{next(_serial)}"
    copy.mkdir(mode=0o700)
    try:
        _copy_metadata(copy, workdir.stat())
        if _apply_layer(workdir, copy):
            raise OSError(errno.EIO, "some entries could not be copied", str(workdir))
    except BaseException:
        remove_throwaway(copy)
        raise
    return copy


def remove_throwaway(copy: Path) -> None:
    """Remove a throwaway copy, whatever modes the run left on it (a folder it made
    unwritable cannot be emptied until it is given its write bit back)."""
    with contextlib.suppress(OSError):
        give_back_owner_bits(copy)
    shutil.rmtree(copy, ignore_errors=True)
    if copy.exists():
        log.warning("a sandbox's throwaway copy of its work tree could not be removed: %s", copy)


def _unmount(root: Path) -> None:
    """Unmount a scratch's overlay and tmpfs (their memory is freed) and remove its folder."""
    for mount_point in (root / "merged", root):
        if _libc.umount2(str(mount_point).encode(), _MNT_DETACH) != 0:
            code = ctypes.get_errno()
            if code not in (errno.EINVAL, errno.ENOENT):
                log.warning("cannot unmount %s: %s", mount_point, os.strerror(code))
    with contextlib.suppress(OSError):
        root.rmdir()


def _mount(source: str, target: Path, kind: str, options: str, flags: int = 0) -> None:
    if _libc.mount(source.encode(), str(target).encode(), kind.encode(),
                   flags | _MS_NOSUID | _MS_NODEV, options.encode()) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), str(target))


def _scratch_parent() -> Path:
    """/run/infraops-sandbox/scratch, made by root, searchable by the sandbox uid (bwrap binds
    from it as that uid); scratches of worker processes that are gone are removed first."""
    parent = _etc_parent() / "scratch"
    parent.mkdir(mode=0o755, exist_ok=True)
    info = parent.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != 0 or info.st_mode & 0o022:
        raise SandboxUnavailable(f"{parent} is not a folder that only root may write: remove it.")
    _remove_orphans(parent)
    return parent


def _remove_orphans(parent: Path) -> None:
    """Unmount the scratches a killed worker process left (named r<pid>-<n>)."""
    for entry in parent.iterdir():
        pid = entry.name[1:].partition("-")[0]
        if not pid.isdigit() or int(pid) == os.getpid() or Path(f"/proc/{pid}").exists():
            continue
        _unmount(entry)


def _same_owner_and_mode(folder: Path, like: Path) -> None:
    info = like.stat()
    os.chown(folder, info.st_uid, info.st_gid)
    folder.chmod(stat.S_IMODE(info.st_mode) & _KEPT_MODE_BITS)


def _apply_layer(layer: Path, target: Path) -> int:
    """Make target hold layer's entries: an overlay whiteout (a 0:0 character device) removes
    the entry, an opaque folder replaces the folder's contents, anything else replaces what is
    there (owners, modes and times kept; symlinks copied, never followed). Returns the entries
    that could not be copied; raises OSError for a full host disk."""
    missed = 0
    stack = [(layer, target)]
    while stack:
        source_folder, target_folder = stack.pop()
        try:
            with os.scandir(source_folder) as listing:
                entries = list(listing)
        except OSError as exc:
            missed += _missed(exc, source_folder)
            continue
        for entry in entries:
            try:
                if _apply_entry(entry, target_folder / entry.name):
                    stack.append((Path(entry.path), target_folder / entry.name))
            except OSError as exc:
                missed += _missed(exc, Path(entry.path))
    return missed


def _missed(exc: OSError, path: Path) -> int:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        raise exc
    log.warning("a file a sandbox left could not be kept: %s: %s", path, exc)
    return 1


def _apply_entry(entry: os.DirEntry[str], destination: Path) -> bool:
    """Copy one entry; True when it is a folder whose entries are to be copied next."""
    info = entry.stat(follow_symlinks=False)
    if stat.S_ISCHR(info.st_mode) and info.st_rdev == 0:
        _remove(destination)
        return False
    if stat.S_ISDIR(info.st_mode):
        if not _is_folder(destination) or _opaque(entry.path):
            _remove(destination)
            destination.mkdir()
        _copy_metadata(destination, info)
        return True
    _remove(destination)
    if stat.S_ISREG(info.st_mode):
        _copy_file(entry.path, destination)
    elif stat.S_ISLNK(info.st_mode):
        destination.symlink_to(Path(entry.path).readlink())
    elif stat.S_ISFIFO(info.st_mode):
        os.mkfifo(destination)
    else:
        return False  # a socket or a device node: nothing a later run could use
    _copy_metadata(destination, info)
    return False


def _is_folder(path: Path) -> bool:
    try:
        return stat.S_ISDIR(path.lstat().st_mode)
    except FileNotFoundError:
        return False


def _opaque(path: str) -> bool:
    try:
        return os.getxattr(path, _OPAQUE, follow_symlinks=False) == b"y"
    except OSError:
        return False


def _remove(path: Path) -> None:
    try:
        info = path.lstat()
    except FileNotFoundError:
        return
    if stat.S_ISDIR(info.st_mode):
        shutil.rmtree(path)
    else:
        path.unlink()


def _copy_file(source: str, destination: Path) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    with Path(source).open("rb") as reader, os.fdopen(os.open(destination, flags, 0o600),
                                                       "wb") as writer:
        shutil.copyfileobj(reader, writer, 1 << 20)


def _copy_metadata(destination: Path, info: os.stat_result) -> None:
    os.chown(destination, info.st_uid, info.st_gid, follow_symlinks=False)
    if not stat.S_ISLNK(info.st_mode):
        destination.chmod(stat.S_IMODE(info.st_mode) & _KEPT_MODE_BITS)
    os.utime(destination, ns=(info.st_atime_ns, info.st_mtime_ns), follow_symlinks=False)
