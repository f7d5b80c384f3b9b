"""The only module in the product that starts probe subprocesses.

Every probe command runs under bubblewrap, as a dedicated non-root uid, with every namespace
unshared, a cleared environment, rlimits, a wall-clock timeout and capped output. The sandbox
fails closed: when a confined process cannot be started, :class:`SandboxUnavailable` is raised
and the command never runs. Nothing here imports Django.

Inside the sandbox the filesystem is built from nothing: ``/usr`` (and the ``/bin``, ``/lib``
links) read-only, an ``/etc`` holding copies of a few harmless files, fresh ``/proc`` and ``/dev``,
tmpfs ``/tmp``, ``/var``, ``/run``, ``/home`` and ``/root``, the worktree read-write at
``/work`` (its ``.git`` read-only), the output folder read-write at ``/out`` and the caller's
read-only binds. Everything else on the host (the service's checkout, its data folder, the
PostgreSQL and Redis sockets, ``/etc/shadow``) is absent.

Process tree of one run::

    supervisor (python, child subreaper)  <- our Popen, its own session and process group
      bwrap                               <- outside the sandbox, as the sandbox uid
        bwrap init, pid 1                 <- inside the pid namespace
          /bin/sh -c COMMAND

The supervisor exists because bwrap exits as soon as the command exits, orphaning its init
process; reparented to the host's pid 1 (which may never reap), each run would leave a zombie of
the sandbox uid that counts against the process limit of every later run.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import pwd
import select
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

log = logging.getLogger(__name__)

BWRAP = "bwrap"
SANDBOX_USER = "infraops-sandbox"
FALLBACK_USER = "nobody"

# The supervisor compiled from infraops/native/sandbox_supervisor.c by scripts/setup.sh: the
# same program as _SUPERVISOR below, about 25 ms faster to start. Without it, the Python one.
SUPERVISOR_BINARY = Path(sys.executable).with_name("infraops-sandbox-supervisor")
SANDBOX_PATH: Final = "/usr/local/bin:/usr/bin:/bin"
_HOST_PATH: Final = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Paths inside the sandbox, each a fresh tmpfs: not the host's shared /tmp.
_TMP_INSIDE: Final = "/tmp"  # noqa: S108
_VAR_TMP_INSIDE: Final = "/var/tmp"  # noqa: S108
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
_ID_MAX: Final = (1 << 32) - 1

_CHUNK: Final = 65536
_TAIL_BYTES: Final = 8192
# After a timeout the pid namespace is killed first so that bwrap and the supervisor reap it;
# the process group is killed only if that has not ended the run within this grace.
_KILL_GRACE_SECONDS: Final = 2.0
_LEFTOVER_WAIT_SECONDS: Final = 2.0
_SUPERVISOR_FAILED: Final = 125

REASON_OK: Final = "ok"
REASON_EXIT: Final = "exit"
REASON_TIMEOUT: Final = "timeout"
REASON_CPU: Final = "cpu-limit"
REASON_MEMORY: Final = "memory-limit"
REASON_FILE_SIZE: Final = "file-size-limit"
REASON_PROCESSES: Final = "process-limit"
REASON_SIGNAL: Final = "signal"

_MEMORY_SIGNATURES: Final = (
    b"memoryerror", b"cannot allocate memory", b"out of memory", b"std::bad_alloc",
    b"outofmemoryerror",
)
_PROCESS_SIGNATURES: Final = (
    b"resource temporarily unavailable", b"cannot fork", b"fork: retry",
    b"can't start new thread",
)
_FILE_SIZE_SIGNATURES: Final = (b"file too large",)

# Runs as our direct child: becomes a child subreaper so that bwrap's orphaned init is reaped
# here, applies the rlimits, the sandbox identity (when started as root) and no_new_privs in its
# child, and exits with bwrap's status. The same program as infraops/native/sandbox_supervisor.c.
# argv: parent pid, rlimits "cpu,as,fsize,nproc", status fd, identity "uid:gid" or "-", command...
_SUPERVISOR: Final = r"""
import ctypes, errno, os, resource, signal, sys
libc = ctypes.CDLL(None, use_errno=True)
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_GET_SECUREBITS, PR_SET_CHILD_SUBREAPER = 1, 24, 27, 36
PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 38, 47, 4
SYS_CAPSET = {"x86_64": 126, "aarch64": 91}.get(os.uname().machine)
def fail(message):
    sys.stderr.write("infraops-sandbox: " + message + "\n")
    os._exit(125)
libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
if os.getppid() != int(sys.argv[1]):
    fail("the service exited before the sandbox started")
if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
    fail("cannot become a child subreaper")
cpu, address_space, file_size, processes = (int(v) for v in sys.argv[2].split(","))
status_fd, identity, argv = int(sys.argv[3]), sys.argv[4], sys.argv[5:]
def become(uid, gid):
    if not (0 < uid < 2**32 - 1 and 0 < gid < 2**32 - 1):
        fail("malformed identity")
    if libc.prctl(PR_GET_SECUREBITS, 0, 0, 0, 0) != 0:
        fail("securebits are set: the switch to the sandbox user would keep capabilities")
    cap = 0
    while libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) == 0:
        cap += 1
    if ctypes.get_errno() != errno.EINVAL:
        fail("cannot drop the capability bounding set")
    if libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0:
        fail("cannot clear the ambient capabilities")
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if SYS_CAPSET is not None:  # the inheritable set survives a uid change
        header, data = (ctypes.c_uint32 * 2)(0x20080522, 0), (ctypes.c_uint32 * 6)()
        if libc.syscall(SYS_CAPSET, header, data) != 0:
            fail("cannot clear the capabilities")
    with open("/proc/self/status") as status:
        caps = [line.split()[1] for line in status if line.startswith(("CapInh", "CapPrm",
                                                                        "CapEff", "CapAmb"))]
    if (os.getresuid() != (uid,) * 3 or os.getresgid() != (gid,) * 3 or os.getgroups()
            or len(caps) != 4 or any(int(c, 16) for c in caps)):
        fail("the switch to the sandbox user did not take")
def limit(which, soft, hard):
    current = resource.getrlimit(which)[1]
    if current != resource.RLIM_INFINITY:
        soft, hard = min(soft, current), min(hard, current)
    resource.setrlimit(which, (soft, hard))
supervisor = os.getpid()
pid = os.fork()
if pid == 0:
    try:
        for name in ("SIGPIPE", "SIGXFSZ", "SIGINT", "SIGTERM"):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
        limit(resource.RLIMIT_CPU, cpu, cpu + 1)
        limit(resource.RLIMIT_AS, address_space, address_space)
        limit(resource.RLIMIT_FSIZE, file_size, file_size)
        limit(resource.RLIMIT_NPROC, processes, processes)
        limit(resource.RLIMIT_CORE, 0, 0)
        if identity != "-":
            become(*(int(v) for v in identity.split(":")))
        # After the switch: changing credentials clears the parent-death signal.
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            fail("cannot set the parent-death signal")
        if os.getppid() != supervisor:
            os._exit(125)
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            fail("cannot set no_new_privs")
        os.execv(argv[0], argv)
    except BaseException as exc:
        fail("cannot start %s: %s" % (argv[0], exc))
os.close(status_fd)
status = 0
while True:
    try:
        child, child_status = os.wait()
    except ChildProcessError:
        break
    if child == pid:
        status = child_status
code = os.waitstatus_to_exitcode(status)
sys.exit(code if code >= 0 else 128 - code)
"""


class SandboxUnavailable(Exception):
    """bwrap missing or unusable; message is one clear sentence for the user."""


@dataclass(frozen=True)
class SandboxLimits:
    """Per-run limits. cpu_seconds, address_space_mb and file_size_mb hold per process;
    processes counts every process and thread of the sandbox uid on this host, so concurrent
    runs share it."""

    wall_seconds: float = 600.0
    cpu_seconds: int = 600
    address_space_mb: int = 8192
    file_size_mb: int = 512
    processes: int = 256
    output_bytes: int = 1_000_000  # cap on kept stdout+stderr each


@dataclass(frozen=True)
class SandboxIdentity:
    uid: int
    gid: int


@dataclass(frozen=True)
class SandboxSpec:
    """What to run. command runs as ``/bin/sh -c command`` in /work. env is added to PATH, HOME
    and LANG (it may override those three) and INFRAOPS_OUT=/out (it may not). Every host path
    must exist; readonly_binds targets are absolute paths inside the sandbox."""

    command: str
    workdir: Path
    out_dir: Path
    env: Mapping[str, str]
    readonly_binds: Sequence[tuple[Path, str]] = ()
    limits: SandboxLimits = SandboxLimits()


@dataclass(frozen=True)
class SandboxResult:
    """How a run ended. exit_code is the status bwrap reports (128+N for a command killed by
    signal N), None when we killed it at the timeout. reason is one of the REASON_* names."""

    exit_code: int | None
    reason: str
    detail: str
    stdout: bytes
    stderr: bytes
    output_truncated: bool
    wall_seconds: float


def sandbox_identity() -> SandboxIdentity:
    """The dedicated non-root user probes run as: user 'infraops-sandbox' if it exists, else
    'nobody'. Raises SandboxUnavailable when neither exists."""
    for name in (SANDBOX_USER, FALLBACK_USER):
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            continue
        return SandboxIdentity(uid=entry.pw_uid, gid=entry.pw_gid)
    raise SandboxUnavailable(
        f"Neither user '{SANDBOX_USER}' nor '{FALLBACK_USER}' exists: create the user "
        f"{SANDBOX_USER} to run probes."
    )


# --------------------------------------------------------------------------- check

_check_lock = threading.Lock()
_check_cache: dict[str, str | None] = {}


def sandbox_check() -> str | None:
    """None when a sandbox can be created here; otherwise the reason as one sentence (e.g.
    'bubblewrap (bwrap) is not installed: apt-get install bubblewrap').

    Starts one trivial sandbox (``true``) per BWRAP setting and caches the answer for the
    life of the process."""
    key = BWRAP
    with _check_lock:
        if key not in _check_cache:
            _check_cache[key] = _try_trivial_sandbox()
        return _check_cache[key]


def _try_trivial_sandbox() -> str | None:
    base = Path(tempfile.mkdtemp(prefix="infraops-sandbox-check-"))
    try:
        base.chmod(0o755)
        identity = _run_identity(None)
        work, out = base / "work", base / "out"
        for path in (work, out):
            sandbox_prepare_dir(path, identity)
        spec = SandboxSpec(command="true", workdir=work, out_dir=out, env={},
                           limits=SandboxLimits(wall_seconds=30.0))
        result = sandbox_run(spec, identity=identity)
    except SandboxUnavailable as exc:
        return str(exc)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    if result.reason != REASON_OK:
        return f"A trivial sandboxed command failed: {result.detail}."
    return None


# --------------------------------------------------------------------------- directories


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


# --------------------------------------------------------------------------- command line


def _run_identity(identity: SandboxIdentity | None) -> SandboxIdentity:
    """The uid/gid the sandbox will run as: the given or dedicated identity when we are root,
    our own otherwise (only root can switch)."""
    if os.geteuid() == 0:
        chosen = identity or sandbox_identity()
        if chosen.uid == 0 or chosen.gid == 0:
            raise SandboxUnavailable("Probes must not run as root: choose a non-root sandbox user.")
        if not (0 < chosen.uid < _ID_MAX and 0 < chosen.gid < _ID_MAX):
            # (uid_t)-1 means "unchanged" to setresuid: the run would stay root.
            raise SandboxUnavailable(f"uid {chosen.uid} / gid {chosen.gid} is not a usable id.")
        return chosen
    own = SandboxIdentity(uid=os.getuid(), gid=os.getgid())
    if identity is not None and identity != own:
        raise SandboxUnavailable(
            f"Only root can run probes as uid {identity.uid}; this service runs as uid {own.uid}."
        )
    return own


def _resolve(program: str, missing: str) -> str:
    found = shutil.which(program, path=_HOST_PATH)
    if found is None:
        raise SandboxUnavailable(missing)
    return found


def _validate(spec: SandboxSpec) -> None:
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
    """Where the copies live: as root, a folder under /run that only root can create, so that
    no other user can take the name first; otherwise the temp folder (a development setup)."""
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


def _bwrap_argv(bwrap: str, spec: SandboxSpec, status_fd: int) -> list[str]:
    argv = [
        bwrap, "--unshare-all", "--unshare-user", "--unshare-cgroup", "--disable-userns",
        "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--hostname", "sandbox",
        "--clearenv",
    ]
    for name, value in _sandbox_env(spec).items():
        argv += ["--setenv", name, value]
    argv += [*_system_args(), *_scratch_args(spec.limits), *_bind_args(spec)]
    return [
        *argv, "--remount-ro", "/", "--chdir", _WORK_INSIDE, "--json-status-fd", str(status_fd),
        "--", "/bin/sh", "-c", spec.command,
    ]


def _launch_argv(spec: SandboxSpec, identity: SandboxIdentity, status_fd: int) -> list[str]:
    bwrap = _resolve(BWRAP, "bubblewrap (bwrap) is not installed: apt-get install bubblewrap.")
    argv = _bwrap_argv(bwrap, spec, status_fd)
    # As root, the supervisor's child becomes the sandbox identity before it starts bwrap.
    become = f"{identity.uid}:{identity.gid}" if os.geteuid() == 0 else "-"
    limits = spec.limits
    rlimits = ",".join(str(value) for value in (
        limits.cpu_seconds, limits.address_space_mb << 20, limits.file_size_mb << 20,
        limits.processes,
    ))
    arguments = [str(os.getpid()), rlimits, str(status_fd), become, *argv]
    if os.access(SUPERVISOR_BINARY, os.X_OK):
        return [str(SUPERVISOR_BINARY), *arguments]
    python = sys.executable or "/usr/bin/python3"
    return [python, "-I", "-S", "-c", _SUPERVISOR, *arguments]


# --------------------------------------------------------------------------- the pid namespace


@dataclass
class _Namespace:
    """The sandbox's pid namespace, pinned: holding its fd keeps its inode from being reused by
    a later sandbox, and the pidfd of its init cannot hit a recycled pid."""

    init_pidfd: int
    ns_fd: int

    @classmethod
    def pin(cls, init_pid: int, ns_inode: int) -> _Namespace | None:
        """None when the init has already gone (and with it every process of the namespace)."""
        try:
            pidfd = os.pidfd_open(init_pid)
        except ProcessLookupError:
            return None
        try:
            ns_fd = os.open(f"/proc/{init_pid}/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            os.close(pidfd)
            return None
        if os.fstat(ns_fd).st_ino != ns_inode:
            os.close(pidfd)
            os.close(ns_fd)
            return None
        return cls(pidfd, ns_fd)

    def kill(self) -> None:
        """SIGKILL the init; the kernel then kills every process of the namespace."""
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(self.init_pidfd, signal.SIGKILL)

    def ended(self) -> bool:
        """True once the init has exited. The kernel kills and reaps every other process of a
        pid namespace before its init's exit completes (the pidfd turns readable only then), and
        nothing can enter a namespace whose init is gone: no /proc scan is needed."""
        poller = select.poll()  # not select(): it refuses descriptors past 1023
        poller.register(self.init_pidfd, select.POLLIN)
        return bool(poller.poll(0))

    def members(self) -> list[int]:
        """Host pids of the processes still in the namespace."""
        mine = os.fstat(self.ns_fd)
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                info = (entry / "ns" / "pid").stat()
            except OSError:
                continue
            if (info.st_dev, info.st_ino) == (mine.st_dev, mine.st_ino):
                found.append(int(entry.name))
        return found

    def ensure_empty(self) -> None:
        """Verify that no process of the run is left; kill any that is (logged: the pid
        namespace and --die-with-parent should have made it impossible)."""
        if self.ended():
            return
        members = self.members()
        if not members:
            return
        log.error("sandbox processes %s outlived their run; killing them", members)
        deadline = time.monotonic() + _LEFTOVER_WAIT_SECONDS
        while members and time.monotonic() < deadline:
            self.kill()
            for pid in members:
                self._kill_member(pid)
            time.sleep(0.05)
            members = self.members()
        if members:
            log.error("sandbox processes %s are still there (zombies or stuck in the kernel)",
                      members)

    def _kill_member(self, pid: int) -> None:
        """SIGKILL pid if it is still in the namespace (checked after taking a pidfd, so a
        recycled pid is never hit)."""
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            return
        try:
            mine, info = os.fstat(self.ns_fd), Path(f"/proc/{pid}/ns/pid").stat()
            if (info.st_dev, info.st_ino) == (mine.st_dev, mine.st_ino):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        except (ProcessLookupError, FileNotFoundError):
            pass
        finally:
            os.close(pidfd)

    def close(self) -> None:
        os.close(self.init_pidfd)
        os.close(self.ns_fd)


# --------------------------------------------------------------------------- one run


@dataclass
class _Capture:
    """One output stream: the kept head (up to limit) and a tail for classifying failures."""

    name: str
    limit: int
    kept: bytearray = field(default_factory=bytearray)
    tail: bytes = b""
    truncated: bool = False

    def feed(self, chunk: bytes) -> bytes:
        """Record chunk; return the part of it that is kept."""
        kept = chunk[: max(self.limit - len(self.kept), 0)]
        self.kept += kept
        self.truncated = self.truncated or len(kept) < len(chunk)
        self.tail = (self.tail + chunk)[-_TAIL_BYTES:]
        return kept


@dataclass
class _Status:
    """bwrap's --json-status-fd stream: the init's pid and namespaces, then the exit code, which
    bwrap writes only when the command was started (never after a setup failure)."""

    buffer: bytearray = field(default_factory=bytearray)
    documents: list[dict[str, object]] = field(default_factory=list)

    def feed(self, chunk: bytes) -> None:
        self.buffer += chunk
        text, self.documents = self.buffer.decode("utf-8", "replace"), []
        decoder, position = json.JSONDecoder(), 0
        while (position := _skip_space(text, position)) < len(text):
            try:
                document, position = decoder.raw_decode(text, position)
            except json.JSONDecodeError:
                return
            if isinstance(document, dict):
                self.documents.append(document)

    def value(self, key: str) -> int | None:
        for document in self.documents:
            found = document.get(key)
            if isinstance(found, int):
                return found
        return None


def _skip_space(text: str, position: int) -> int:
    while position < len(text) and text[position].isspace():
        position += 1
    return position


class _Run:
    """Pumps one started sandbox's output until it ends or its deadline passes."""

    def __init__(self, spec: SandboxSpec, on_output: Callable[[str, bytes], None] | None) -> None:
        self.spec = spec
        self.on_output = on_output
        self.stdout = _Capture("stdout", spec.limits.output_bytes)
        self.stderr = _Capture("stderr", spec.limits.output_bytes)
        self.status = _Status()
        self.namespace: _Namespace | None = None
        self.timed_out = False

    def pump(self, process: subprocess.Popen[bytes], status_fd: int, deadline: float) -> None:
        assert process.stdout is not None and process.stderr is not None
        readers: dict[int, Callable[[bytes], None]] = {
            process.stdout.fileno(): lambda chunk: self._keep(self.stdout, chunk),
            process.stderr.fileno(): lambda chunk: self._keep(self.stderr, chunk),
            status_fd: self._on_status,
        }
        with selectors.DefaultSelector() as selector:
            for fd in readers:
                selector.register(fd, selectors.EVENT_READ)
            while selector.get_map():
                now = time.monotonic()
                if now >= deadline:
                    if self.timed_out:
                        return
                    self._kill_on_timeout(process)
                    deadline = now + _KILL_GRACE_SECONDS
                for key, _ in selector.select(timeout=max(deadline - now, 0.0)):
                    chunk = os.read(key.fd, _CHUNK)
                    if chunk:
                        readers[key.fd](chunk)
                    else:
                        selector.unregister(key.fd)

    def _keep(self, capture: _Capture, chunk: bytes) -> None:
        kept = capture.feed(chunk)
        if kept and self.on_output is not None:
            self.on_output(capture.name, kept)

    def _on_status(self, chunk: bytes) -> None:
        self.status.feed(chunk)
        init_pid, ns_inode = self.status.value("child-pid"), self.status.value("pid-namespace")
        if self.namespace is None and init_pid is not None and ns_inode is not None:
            self.namespace = _Namespace.pin(init_pid, ns_inode)

    def _kill_on_timeout(self, process: subprocess.Popen[bytes]) -> None:
        self.timed_out = True
        if self.namespace is not None:
            self.namespace.kill()
        else:
            _kill_group(process)

    def abort(self, process: subprocess.Popen[bytes]) -> None:
        """Kill everything at once (the caller is unwinding; Popen's exit then reaps)."""
        if self.namespace is not None:
            self.namespace.kill()
        _kill_group(process)

    def finish(self, process: subprocess.Popen[bytes], started: float) -> SandboxResult:
        """Reap the supervisor, verify that nothing of the run is left, and classify."""
        if self.timed_out:
            _kill_group(process)
        _, wait_status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(wait_status)
        wall = time.monotonic() - started
        if self.namespace is not None:
            self.namespace.ensure_empty()
        exit_code = self.status.value("exit-code")
        if exit_code is None and not self.timed_out:
            return self._setup_failure(wall)
        return _classify(
            self.spec.limits, exit_code=None if self.timed_out else exit_code,
            cpu_seconds=usage.ru_utime + usage.ru_stime, wall=wall,
            stdout=self.stdout, stderr=self.stderr,
        )

    def _setup_failure(self, wall: float) -> SandboxResult:
        """The command never started: fail closed, except that running out of processes of the
        sandbox uid is the run's limit rather than a broken host."""
        lines = bytes(self.stderr.kept).decode("utf-8", "replace").strip().splitlines()
        message = lines[-1] if lines else "bwrap exited without starting the command"
        if "Resource temporarily unavailable" in message:
            return SandboxResult(
                exit_code=None, reason=REASON_PROCESSES,
                detail=f"the sandbox could not start: {message}", stdout=b"",
                stderr=bytes(self.stderr.kept), output_truncated=False, wall_seconds=wall,
            )
        raise SandboxUnavailable(f"The sandbox could not start: {message}.")

    def close(self) -> None:
        if self.namespace is not None:
            self.namespace.close()


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


def sandbox_run(
    spec: SandboxSpec,
    *,
    on_output: Callable[[str, bytes], None] | None = None,
    identity: SandboxIdentity | None = None,
) -> SandboxResult:
    """Run spec.command confined. Raises SandboxUnavailable when it cannot confine (fail closed:
    never runs unconfined). on_output(stream_name, chunk) is called with output chunks as they
    arrive (for live streaming), only for the kept (capped) part.

    on_output runs on the calling thread and must return quickly: the wall-clock timeout is
    checked between chunks. Returns only once every process of the run has ended. Raises
    ValueError for a spec whose host paths do not exist."""
    _validate(spec)
    chosen = _run_identity(identity)
    status_read, status_write = os.pipe()
    run = _Run(spec, on_output)
    try:
        argv = _launch_argv(spec, chosen, status_write)
        started = time.monotonic()
        process = _start(argv, status_write)
        os.close(status_write)
        status_write = -1
        with process:
            try:
                run.pump(process, status_read, started + spec.limits.wall_seconds)
            except BaseException:
                run.abort(process)
                raise
            return run.finish(process, started)
    finally:
        run.close()
        os.close(status_read)
        if status_write != -1:
            os.close(status_write)


def _start(argv: list[str], status_fd: int) -> subprocess.Popen[bytes]:
    try:
        return subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            pass_fds=(status_fd,), start_new_session=True, cwd="/",
            env={"PATH": _HOST_PATH, "LANG": "C.UTF-8"},
        )
    except OSError as exc:
        raise SandboxUnavailable(f"The sandbox supervisor could not start: {exc}.") from exc


# --------------------------------------------------------------------------- classification


def _classify(
    limits: SandboxLimits, *, exit_code: int | None, cpu_seconds: float, wall: float,
    stdout: _Capture, stderr: _Capture,
) -> SandboxResult:
    reason, detail = _reason(limits, exit_code, cpu_seconds, wall, stderr.tail.lower())
    return SandboxResult(
        exit_code=exit_code, reason=reason, detail=detail, stdout=bytes(stdout.kept),
        stderr=bytes(stderr.kept), output_truncated=stdout.truncated or stderr.truncated,
        wall_seconds=wall,
    )


def _reason(
    limits: SandboxLimits, exit_code: int | None, cpu_seconds: float, wall: float, tail: bytes,
) -> tuple[str, str]:
    """(reason, detail) for a finished run; exit_code None means we killed it at the timeout."""
    if exit_code is None:
        return REASON_TIMEOUT, f"killed after {wall:.1f} s wall-clock timeout"
    if exit_code == 0:
        return REASON_OK, "exited with status 0"
    signum = exit_code - 128 if 128 < exit_code < 128 + signal.NSIG else None
    # RLIMIT_CPU sends SIGXCPU at the soft limit and SIGKILL one second later; a SIGKILL has
    # other causes, so it counts only when the run used that much CPU.
    if signum == signal.SIGXCPU or (
        signum == signal.SIGKILL and cpu_seconds >= limits.cpu_seconds
    ):
        return REASON_CPU, f"stopped at the {limits.cpu_seconds} s CPU-time limit"
    if signum == signal.SIGXFSZ or _has(tail, _FILE_SIZE_SIGNATURES):
        return REASON_FILE_SIZE, f"stopped at the {limits.file_size_mb} MB file-size limit"
    if _has(tail, _MEMORY_SIGNATURES):
        return REASON_MEMORY, f"ran out of memory under the {limits.address_space_mb} MB limit"
    if _has(tail, _PROCESS_SIGNATURES):
        return REASON_PROCESSES, f"could not start a process under the {limits.processes} limit"
    if signum is not None:
        name = signal.Signals(signum).name
        return REASON_SIGNAL, f"killed by {name} (exit status {exit_code})"
    return REASON_EXIT, f"exited with status {exit_code}"


def _has(tail: bytes, signatures: Sequence[bytes]) -> bool:
    return any(signature in tail for signature in signatures)
