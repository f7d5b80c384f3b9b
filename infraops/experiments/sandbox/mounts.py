"""What a sandbox is made of: bubblewrap's command line (every namespace unshared, a cleared
environment, a filesystem built from nothing) and the copy of /etc it shows.

Inside, ``/usr`` (and the ``/bin``, ``/lib`` links) is read-only, ``/etc`` holds copies of a
few harmless files, ``/proc`` and ``/dev`` are fresh, ``/tmp``, ``/var``, ``/run``, ``/home`` and
``/root`` are sized tmpfs, the worktree is read-write at ``/work`` (its ``.git`` read-only), the
output folder read-write at ``/out`` (both on the run's scratch where there is one: scratch.py),
and the caller's read-only binds are where it asked."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
import tempfile
import threading
from pathlib import Path
from typing import Final

from infraops.experiments.sandbox.config import SandboxLimits, SandboxSpec, SandboxUnavailable
from infraops.experiments.sandbox.devices import _device_args, accelerator_device
from infraops.experiments.sandbox.folders import _tree_entries

SANDBOX_PATH: Final = "/usr/local/bin:/usr/bin:/bin"
# Paths inside the sandbox, each a fresh tmpfs: not the host's shared /tmp.
_TMP_INSIDE: Final = "/tmp"  # noqa: S108  (inside the sandbox: a fresh tmpfs)  # nosec B108
_VAR_TMP_INSIDE: Final = "/var/tmp"  # noqa: S108  (the same)  # nosec B108
_BASE_ENV: Final = {"PATH": SANDBOX_PATH, "HOME": _TMP_INSIDE, "LANG": "C.UTF-8"}
_OUT_INSIDE: Final = "/out"
_WORK_INSIDE: Final = "/work"

# Files a program may need to start (dynamic loader, user names, time zone, name service
# switch); never shadow, gshadow, sudoers, ssh keys or credential helpers (/etc/gitconfig here
# names one).
_ETC_FILES: Final = (
    "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "localtime", "timezone",
    "passwd", "group", "nsswitch.conf", "hosts", "host.conf", "protocols", "services",
    "os-release", "debian_version", "mime.types", "ssl/certs", "ssl/openssl.cnf",
)
_ETC_SOURCE = Path("/etc")
_ETC_COPIES = Path("/run/infraops-sandbox")  # see _etc_parent
_TOP_LEVEL_LINKS: Final = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_SMALL_TMPFS_BYTES: Final = 64 << 20


def _bwrap_argv(bwrap: str, spec: SandboxSpec, status_fd: int) -> list[str]:
    """bwrap's whole command line for spec (bwrap being its resolved path): it reports the
    init's pid, its namespaces and the command's exit code on status_fd."""
    argv = [
        bwrap, "--unshare-all", "--unshare-user", "--unshare-cgroup", "--disable-userns",
        "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--hostname", "sandbox",
        "--clearenv",
    ]
    for name, value in _sandbox_env(spec).items():
        argv += ["--setenv", name, value]
    argv += [*_system_args(), *_device_args(spec), *_scratch_args(spec.limits),
             *_bind_args(spec)]
    return [
        *argv, "--remount-ro", "/", "--chdir", _WORK_INSIDE, "--json-status-fd", str(status_fd),
        "--", "/bin/sh", "-c", spec.command,
    ]


def _validate(spec: SandboxSpec) -> None:
    """Raises ValueError for a spec that must not reach bwrap: a device that is not an
    accelerator node, a missing folder, a bind source that is a symlink or missing, a relative
    target, a malformed environment variable."""
    for device in spec.devices:
        problem = accelerator_device(device)
        if problem:
            raise ValueError(f"{problem}, so it cannot be given to the sandbox.")
    for host in (spec.workdir, spec.out_dir):
        if not host.is_dir():
            raise ValueError(f"{host} is not a folder.")
    for host, inside in spec.readonly_binds:
        # A bind source inside a worktree may have been replaced by an earlier probe; a symlink
        # there would bind whatever host path it names.
        if host.is_symlink() or not host.exists():
            raise ValueError(f"{host} is a symlink or missing, so it cannot be bound at {inside}.")
        if not inside.startswith("/"):
            raise ValueError(f"{inside} is not an absolute path inside the sandbox.")
    for name, value in spec.env.items():
        if not name or "=" in name or "\0" in name or "\0" in value:
            raise ValueError(f"{name!r} is not a valid environment variable.")


def _sandbox_env(spec: SandboxSpec) -> dict[str, str]:
    return {**_BASE_ENV, **spec.env, "INFRAOPS_OUT": _OUT_INSIDE}


def _system_args() -> list[str]:
    """Read-only system folders; /bin and friends are symlinks into /usr on merged-/usr hosts."""
    args = ["--ro-bind", "/usr", "/usr"]
    for top in map(Path, _TOP_LEVEL_LINKS):
        if top.is_symlink():
            args += ["--symlink", str(top.readlink()), str(top)]
        elif top.is_dir():
            args += ["--ro-bind", str(top), str(top)]
    return [*args, "--ro-bind", str(_etc_snapshot()), "/etc", "--proc", "/proc", "--dev", "/dev"]


_etc_lock = threading.Lock()


def _etc_snapshot() -> Path:
    """A folder holding copies of the _ETC_FILES, bound read-only as the sandbox's /etc: one
    mount where a bind per file cost 2.3 ms of every sandbox start here.

    Named after the sources' metadata, so a changed source (apt updating ld.so.cache, a new
    time zone, update-ca-certificates changing ssl/certs) gets a new folder; a folder in use is
    never changed. Shared by the processes of one uid, accepted only when that uid owns it and
    nobody else may write it."""
    fingerprint = hashlib.sha256()
    for name in _ETC_FILES:
        with contextlib.suppress(OSError):
            info = os.lstat(_ETC_SOURCE / name)
            fingerprint.update(
                f"{name} {info.st_ino} {info.st_mode} {info.st_size} {info.st_mtime_ns}\n".encode())
    with _etc_lock:
        path = _etc_parent() / f"etc-{os.geteuid()}-{fingerprint.hexdigest()[:20]}"
        if not _trusted_folder(path):
            try:
                _etc_build(path)
            except OSError as exc:
                raise SandboxUnavailable(f"Could not copy /etc for the sandbox: {exc}.") from exc
    return path


def _etc_parent() -> Path:
    """Where the copies live, and the uid leases' locks (uids.py): as root, a folder under /run
    that only root can create, so that no other user can take the name first; otherwise the
    temp folder (a development setup)."""
    if os.geteuid() != 0:
        return Path(tempfile.gettempdir())
    parent = _ETC_COPIES
    parent.mkdir(exist_ok=True)
    _trusted_folder(parent)
    if stat.S_IMODE(parent.stat().st_mode) != 0o755:
        parent.chmod(0o755)  # the sandbox uid passes through it (a umask may have said no)
    return parent


def _trusted_folder(path: Path) -> bool:
    try:
        info = path.lstat()
    except FileNotFoundError:
        return False
    if (not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid()
            or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)):
        raise SandboxUnavailable(
            f"{path} is not a folder of uid {os.geteuid()} that only it may write: remove it.")
    return True


def _etc_build(path: Path) -> None:
    """Copy the files (symlinks as symlinks: they point into /usr or the copy itself; modes
    as they are, less group and other write) into a private folder, then publish it under path
    in one rename."""
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=path.parent))
    try:
        made = [staging]
        for name in _ETC_FILES:
            source, copy = _ETC_SOURCE / name, staging / name
            if not os.path.lexists(source):
                continue
            if not copy.parent.exists():
                copy.parent.mkdir(parents=True)
                made.append(copy.parent)
            if source.is_dir() and not source.is_symlink():
                shutil.copytree(source, copy, symlinks=True)
            else:
                shutil.copy2(source, copy, follow_symlinks=False)
        for entry in _tree_entries(staging):
            if not entry.is_symlink():
                entry.chmod(stat.S_IMODE(entry.lstat().st_mode) & ~0o022)
        for folder in made:
            folder.chmod(0o755)
        try:
            staging.rename(path)
        except OSError:
            if not _trusted_folder(path):  # another process published it first
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _scratch_args(limits: SandboxLimits) -> list[str]:
    """tmpfs scratch folders, sized so that a probe cannot fill the host's memory through them."""
    large = str(limits.file_size_mb << 20)
    small = str(_SMALL_TMPFS_BYTES)
    return [
        "--size", large, "--tmpfs", _TMP_INSIDE,
        "--size", large, "--tmpfs", "/var",
        "--dir", _VAR_TMP_INSIDE,
        "--size", small, "--tmpfs", "/run",
        "--size", small, "--tmpfs", "/home",
        "--size", small, "--tmpfs", "/root",
    ]


def _bind_args(spec: SandboxSpec) -> list[str]:
    args = ["--bind", str(spec.workdir), _WORK_INSIDE]
    git = spec.workdir / ".git"
    inside_targets = {inside for _, inside in spec.readonly_binds}
    if f"{_WORK_INSIDE}/.git" not in inside_targets and git.exists() and not git.is_symlink():
        args += ["--ro-bind", str(git), f"{_WORK_INSIDE}/.git"]
    args += ["--bind", str(spec.out_dir), _OUT_INSIDE]
    for host, inside in spec.readonly_binds:
        args += ["--ro-bind", str(host), inside]
    return args

