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
PostgreSQL and Redis sockets, ``/etc/shadow``) is absent. A probe that needs an accelerator is
given its device nodes, and nothing else of the host's ``/dev`` (:func:`accelerator_device`).

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
import fcntl
import hashlib
import json
import logging
import os
import pwd
import re
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
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

log = logging.getLogger(__name__)

BWRAP = "bwrap"
SANDBOX_USER = "infraops-sandbox"
FALLBACK_USER = "nobody"

# The supervisor compiled from infraops/experiments/native/sandbox_supervisor.c by
# scripts/setup.sh: the
# same program as _SUPERVISOR below, about 25 ms faster to start. Without it, the Python one.
SUPERVISOR_BINARY = Path(sys.executable).with_name("infraops-sandbox-supervisor")
SANDBOX_PATH: Final = "/usr/local/bin:/usr/bin:/bin"
_HOST_PATH: Final = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
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
REASON_DISK: Final = "disk-limit"
REASON_SIGNAL: Final = "signal"
# Reasons of a run the sandbox stopped (or whose quota it found spent at the end): a failure even
# when the command's own status was 0.
_ENFORCED: Final = frozenset({REASON_TIMEOUT, REASON_MEMORY, REASON_DISK, REASON_CPU})

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
# child, and exits with bwrap's status. The same program as
# infraops/experiments/native/sandbox_supervisor.c.
# argv: parent pid, rlimits "cpu,as,fsize,nproc" (as 0: no address-space limit), status fd,
# identity "uid:gid" or "-", command...
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
        if address_space:
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
    """Per-run limits. cpu_seconds, address_space_mb and file_size_mb hold per process
    (rlimits).

    processes counts the processes and threads of this sandbox alone where a pids control group
    can be made (see :func:`sandbox_containment`); without one it is RLIMIT_NPROC, which counts
    every process of the sandbox uid on the host: the uid an experiment leases for itself
    (:func:`sandbox_identity_lease`), so that concurrent experiments do not share it. memory_mb is
    the total memory of every process of the sandbox together, its tmpfs files included (a
    memory control group; not enforced without one). disk_mb is the total the run may add to its
    work tree and output folder (measured every _DISK_CHECK_SECONDS; files it deleted while
    still holding them open count). total_cpu_seconds, when set, is the CPU time of every
    process of the run together (a cpuacct control group)."""

    wall_seconds: float = 600.0
    cpu_seconds: int = 600
    # None: no RLIMIT_AS. GPU drivers reserve far more address space than they use (CUDA maps
    # the device's and the host's memory into every process), so a GPU probe is bounded by
    # the memory control group alone; sandbox_run refuses such a run where there is none.
    address_space_mb: int | None = 8192
    file_size_mb: int = 512
    processes: int = 256
    output_bytes: int = 1_000_000  # cap on kept stdout+stderr each
    memory_mb: int = 4096
    disk_mb: int = 2048
    total_cpu_seconds: int | None = None


@dataclass(frozen=True)
class SandboxMaxima:
    """The operator's ceilings on what one probe may ask for (settings.SANDBOX_MAX_*)."""

    processes: int = 1024
    memory_mb: int = 8192
    disk_mb: int = 8192


def probe_limits(
    *, wall_seconds: float, maxima: SandboxMaxima, processes: int | None = None,
    memory_mb: int | None = None, disk_mb: int | None = None,
) -> SandboxLimits:
    """The limits of one probe execution: what the probe asks for (None: the default, lowered
    to the maximum), each a positive whole number at most the operator's maximum. Raises
    ValueError naming the first value that is not."""
    defaults = SandboxLimits()
    chosen: dict[str, int] = {}
    for key, asked, default, ceiling in (
        ("processes", processes, defaults.processes, maxima.processes),
        ("memory_mb", memory_mb, defaults.memory_mb, maxima.memory_mb),
        ("disk_mb", disk_mb, defaults.disk_mb, maxima.disk_mb),
    ):
        if asked is None:
            chosen[key] = min(default, ceiling)
        elif isinstance(asked, bool) or not isinstance(asked, int) or asked <= 0:
            raise ValueError(f"{key} = {asked!r} must be a positive whole number")
        elif asked > ceiling:
            raise ValueError(f"{key} = {asked} is over this host's maximum of {ceiling}")
        else:
            chosen[key] = asked
    return SandboxLimits(wall_seconds=wall_seconds, **chosen)


@dataclass(frozen=True)
class SandboxIdentity:
    uid: int
    gid: int


@dataclass(frozen=True)
class SandboxSpec:
    """What to run. command runs as ``/bin/sh -c command`` in /work. env is added to PATH, HOME
    and LANG (it may override those three) and INFRAOPS_OUT=/out (it may not). Every host path
    must exist; readonly_binds targets are absolute paths inside the sandbox. devices are
    accelerator device nodes (see :func:`accelerator_device`), each at its own path inside."""

    command: str
    workdir: Path
    out_dir: Path
    env: Mapping[str, str]
    readonly_binds: Sequence[tuple[Path, str]] = ()
    limits: SandboxLimits = SandboxLimits()
    devices: Sequence[Path] = ()


@dataclass(frozen=True)
class SandboxResult:
    """How a run ended. exit_code is the status bwrap reports (128+N for a command killed by
    signal N), None when we killed it (at the timeout, or at the disk or total-CPU limit).
    reason is one of the REASON_* names: the first limit the run hit when it hit one.
    limits_hit names every limit hit, in the order they happened; detail says each (with when),
    then how the command ended, then where output was cut. stdout_bytes and stderr_bytes count
    what the command wrote, kept or not."""

    exit_code: int | None
    reason: str
    detail: str
    stdout: bytes
    stderr: bytes
    output_truncated: bool
    wall_seconds: float
    limits_hit: tuple[str, ...] = ()
    stdout_bytes: int = 0
    stderr_bytes: int = 0


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


# --------------------------------------------------------------------------- identity leases

# Where no pids control group can be made, RLIMIT_NPROC is the process limit, and the kernel
# counts it per uid: with one sandbox uid, a fork bomb in one experiment made a concurrent one
# fail ("could not start a process under the 256 limit"). So there, each experiment takes a
# uid of its own from a pool (settings.SANDBOX_UID_POOL: numeric ids no account uses; they
# need no passwd entry). A lease is a lock file under /run/infraops-sandbox/uids, so the
# worker's processes and workers on one host never share a uid; a holder that died leaves its
# lock released by the kernel, and the next holder kills what that uid still runs.
_UID_LOCKS = "uids"


@contextlib.contextmanager
def sandbox_identity_lease(pool: range) -> Iterator[SandboxIdentity]:
    """The identity every sandbox of one experiment runs as, held until the block ends.

    The dedicated identity (sandbox_identity()) where each sandbox gets its own pids control
    group or where we are not root (only root can switch uids; a development setup runs as
    itself). Otherwise a uid of `pool` no other experiment holds, with no process left running
    under it before and after. Raises SandboxUnavailable when every uid of the pool is held."""
    if os.geteuid() != 0 or not pool or _per_sandbox_processes():
        yield sandbox_identity()
        return
    folder = _etc_parent() / _UID_LOCKS
    folder.mkdir(mode=0o700, exist_ok=True)
    start = int.from_bytes(os.urandom(2), "little") % len(pool)  # spread the workers out
    for uid in (pool[(start + i) % len(pool)] for i in range(len(pool))):
        handle = os.open(folder / f"{uid}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(handle)
            continue
        try:
            _kill_uid(uid)
            yield SandboxIdentity(uid=uid, gid=uid)
        finally:
            try:
                _kill_uid(uid)
            finally:
                os.close(handle)  # releases the lock
        return
    raise SandboxUnavailable(
        f"Every sandbox uid of the pool ({pool.start}-{pool.stop - 1}) is in use: raise "
        "INFRAOPS_SANDBOX_UID_POOL or run fewer experiments at once.")


_pids_groups_seen = False  # a pids control group was made once: it can be made here


def _per_sandbox_processes() -> bool:
    """Whether a sandbox run here gets its own pids control group. Only a yes is remembered:
    a group that could not be made for a moment (EAGAIN) is tried again next time."""
    global _pids_groups_seen
    if not _pids_groups_seen:
        groups = _Cgroups.make(SandboxLimits())
        try:
            _pids_groups_seen = "pids" in groups.controllers
        finally:
            groups.remove()
    return _pids_groups_seen


def _kill_uid(uid: int) -> None:
    """SIGKILL every process whose real uid is `uid` until none is left (a lease's uid runs
    nothing but that lease's sandboxes)."""
    deadline = time.monotonic() + _LEFTOVER_WAIT_SECONDS * 5
    while (pids := _pids_of_uid(uid)) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
    if pids:
        log.warning("processes of sandbox uid %s outlived SIGKILL: %s", uid, sorted(pids))


def _pids_of_uid(uid: int) -> set[int]:
    """Live (not zombie) processes whose real uid is `uid`, from /proc."""
    found = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            status = Path(entry.path, "status").read_text()
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            if (int(fields["Uid"].split()[0]) == uid
                    and not fields["State"].strip().startswith("Z")):
                found.add(int(entry.name))
    return found


# --------------------------------------------------------------------------- check

_check_lock = threading.Lock()
_check_cache: dict[str, str | None] = {}  # BWRAP -> None: only a check that passed is kept
_check_failures: dict[str, tuple[float, str]] = {}  # BWRAP -> (when, the last failure)
# A failed check is tried again after each of these pauses (seconds) before the process says it
# cannot run probes: a trivial sandbox can fail for a moment (EAGAIN while the host is short of
# processes, a busy /run) that one try must not turn into "this worker has no sandbox".
CHECK_RETRY_DELAYS: tuple[float, ...] = (0.2, 0.5, 1.0, 2.0)
# A failure stands this long (no new tries meanwhile); the next call checks again, with retries.
CHECK_FAILURE_SECONDS = 30.0
_NOT_INSTALLED: Final = "bubblewrap (bwrap) is not installed"


def sandbox_check() -> str | None:
    """None when a sandbox can be created here; otherwise the reason as one sentence (e.g.
    'bubblewrap (bwrap) is not installed: apt-get install bubblewrap').

    Starts one trivial sandbox (``true``) per BWRAP setting. A pass is kept for the life of the
    process; a failure is retried after each of CHECK_RETRY_DELAYS first (a missing bwrap is not:
    nothing transient about it), then stands for CHECK_FAILURE_SECONDS, after which the next call
    checks again."""
    key = BWRAP
    with _check_lock:
        if key in _check_cache:
            return _check_cache[key]
        failed = _check_failures.get(key)
        if failed is not None and time.monotonic() - failed[0] < CHECK_FAILURE_SECONDS:
            return failed[1]
        problem = _try_trivial_sandbox()
        for delay in CHECK_RETRY_DELAYS:
            if problem is None or problem.startswith(_NOT_INSTALLED):
                break
            log.warning("sandbox check failed (%s); trying again in %.1f s", problem, delay)
            time.sleep(delay)
            problem = _try_trivial_sandbox()
        if problem is None:
            _check_cache[key] = None
            _check_failures.pop(key, None)
        else:
            _check_failures[key] = (time.monotonic(), problem)
        return problem


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


# The device nodes a probe may be given: GPUs and their control, memory-manager and capability
# nodes (NVIDIA), the compute and render nodes of AMD and Intel GPUs, and accel nodes. Never
# /dev/mem, a disk, a terminal or the kernel log, whatever an operator's pattern matches.
_ACCELERATOR_DEVICE = re.compile(
    r"/dev/(nvidia(\d+|ctl|-uvm|-uvm-tools|-modeset)|nvidia-caps/nvidia-cap\d+|kfd"
    r"|dri/renderD\d+|accel/accel\d+)")


def accelerator_device(path: Path) -> str | None:
    """Why `path` cannot be given to a probe as an accelerator device; None when it can: one
    of the accelerator nodes above, a character device, not a symlink."""
    if not _ACCELERATOR_DEVICE.fullmatch(str(path)):
        return f"{path} is not an accelerator device node (GPU, compute or render node)"
    try:
        info = path.lstat()
    except OSError:
        return f"{path} does not exist"
    if not stat.S_ISCHR(info.st_mode):
        return f"{path} is not a character device"
    return None


def _validate(spec: SandboxSpec) -> None:
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


def _device_args(spec: SandboxSpec) -> list[str]:
    """The accelerator nodes, over the fresh /dev (bwrap makes the parent folders)."""
    args: list[str] = []
    for device in spec.devices:
        args += ["--dev-bind", str(device), str(device)]
    return args


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
    argv += [*_system_args(), *_device_args(spec), *_scratch_args(spec.limits),
             *_bind_args(spec)]
    return [
        *argv, "--remount-ro", "/", "--chdir", _WORK_INSIDE, "--json-status-fd", str(status_fd),
        "--", "/bin/sh", "-c", spec.command,
    ]


def _launch_argv(
    spec: SandboxSpec, identity: SandboxIdentity, status_fd: int, groups: _Cgroups | None = None,
) -> list[str]:
    bwrap = _resolve(BWRAP, f"{_NOT_INSTALLED}: apt-get install bubblewrap.")
    argv = _bwrap_argv(bwrap, spec, status_fd)
    # As root, the supervisor's child becomes the sandbox identity before it starts bwrap.
    become = f"{identity.uid}:{identity.gid}" if os.geteuid() == 0 else "-"
    limits = spec.limits
    per_sandbox = groups is not None and "pids" in groups.controllers
    address_space = 0 if limits.address_space_mb is None else limits.address_space_mb << 20
    rlimits = ",".join(str(value) for value in (  # an address space of 0: no RLIMIT_AS
        limits.cpu_seconds, address_space, limits.file_size_mb << 20,
        _UID_PROCESS_CAP if per_sandbox else limits.processes,
    ))
    arguments = [str(os.getpid()), rlimits, str(status_fd), become, *argv]
    if os.access(SUPERVISOR_BINARY, os.X_OK):
        command = [str(SUPERVISOR_BINARY), *arguments]
    else:
        python = sys.executable or "/usr/bin/python3"
        command = [python, "-I", "-S", "-c", _SUPERVISOR, *arguments]
    joins = groups.join_files() if groups is not None else []
    if joins:  # the shell joins the groups as root, then becomes the supervisor (same pid)
        return ["/bin/sh", "-c", _JOIN, "infraops-cgroup-join", *joins, "--", *command]
    return command


# --------------------------------------------------------------------------- control groups

# Each run gets control groups of its own, below the worker's own ones, in a folder of this
# name: <worker's cgroup>/infraops-sandbox/r<worker pid>-<n>-<random>. Processes of the run stay
# inside whatever contains the worker (its memory accounting, its own limits, its kill at stop).
CGROUP_FOLDER = "infraops-sandbox"
# Where cgroup v2 forbids that (the worker's own group holds processes, so it may not hand
# controllers to children: a container's or a service's group), the operator names a group that
# holds none, delegated to the worker (systemd's Delegate=, or a folder root made): the runs'
# groups are made below it instead, outside the worker's own accounting.
CGROUP_DELEGATED_ENV = "INFRAOPS_SANDBOX_CGROUP"
_CGROUP_CONTROLLERS: Final = ("pids", "memory", "cpuacct")
_CGROUP_ROOT = Path("/proc/self")  # where cgroup and mountinfo are read (tests point it away)
# The supervisor, bwrap and bwrap's init live in the run's pids group besides the command.
_OVERHEAD_PROCESSES: Final = 3
# With a pids group the per-uid RLIMIT_NPROC would make concurrent runs share one count again:
# it is raised to this (the pids group is the limit then).
_UID_PROCESS_CAP: Final = 1 << 20
_CGROUP_REMOVE_SECONDS: Final = 5.0
# Joins the groups named before "--" (their cgroup.procs files), then becomes the supervisor:
# every process of the run is born inside them.
_JOIN: Final = (
    'while [ "$1" != -- ]; do echo $$ > "$1" 2>/dev/null || { '
    'echo "infraops-sandbox: cannot join the control group $1" >&2; exit 125; }; shift; done; '
    'shift; exec "$@"'
)

_cgroup_lock = threading.Lock()
_cgroup_serial = 0
_cgroup_note: list[str] = []  # the last reason control groups could not be used (logged once)


@dataclass(frozen=True)
class _CgroupPlaces:
    """Where the worker's own control groups are: per cgroup-v1 controller its folder, and its
    cgroup-v2 folder with the controllers that are available there."""

    v1: dict[str, Path]
    v2: Path | None
    v2_controllers: frozenset[str]


def _cgroup_places() -> _CgroupPlaces:
    memberships: list[tuple[set[str], str]] = []
    v2_path: str | None = None
    for line in (_CGROUP_ROOT / "cgroup").read_text().splitlines():
        number, controllers, path = line.split(":", 2)
        if number == "0" and not controllers:
            v2_path = path
        else:
            memberships.append((set(controllers.split(",")), path))
    v1: dict[str, Path] = {}
    v2: Path | None = None
    for line in (_CGROUP_ROOT / "mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        root, mountpoint = _unescape(fields[3]), Path(_unescape(fields[4]))
        if tail[0] == "cgroup":
            options = set(tail[2].split(","))
            for controller in _CGROUP_CONTROLLERS:
                for names, path in memberships:
                    if controller in names and controller in options and controller not in v1:
                        inside = _below(root, path)
                        if inside is not None:
                            v1[controller] = mountpoint / inside
        elif tail[0] == "cgroup2" and v2_path is not None and v2 is None:
            inside = _below(root, v2_path)
            if inside is not None:
                v2 = mountpoint / inside
    available: frozenset[str] = frozenset()
    if v2 is not None:
        with contextlib.suppress(OSError):
            available = frozenset((v2 / "cgroup.controllers").read_text().split())
    return _CgroupPlaces(v1, v2, available - set(v1))


def _unescape(text: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        text = text.replace(code, char)
    return text


def _below(root: str, path: str) -> str | None:
    """path (a cgroup) relative to the mount's root, or None when the mount does not show it."""
    if root == "/":
        return path.lstrip("/")
    if path == root or path.startswith(root.rstrip("/") + "/"):
        return path[len(root):].lstrip("/")
    return None


class _Cgroups:
    """One run's control groups: made before it starts, read while it runs, emptied and removed
    after it. v1 has one folder per controller; v2 one folder for all."""

    def __init__(self, limits: SandboxLimits) -> None:
        self.limits = limits
        self.v1: dict[str, Path] = {}
        self.v2: Path | None = None
        self.v2_controllers: set[str] = set()
        self.notes: list[str] = []

    @property
    def controllers(self) -> set[str]:
        return set(self.v1) | self.v2_controllers

    @classmethod
    def make(cls, limits: SandboxLimits) -> _Cgroups:
        """The run's groups for every controller that can be used here; a controller that
        cannot leaves a note (see sandbox_containment) and the run goes on without it."""
        groups = cls(limits)
        if os.geteuid() != 0:
            groups.notes.append("the service does not run as root")
            return groups
        try:
            places = _cgroup_places()
        except (OSError, ValueError) as exc:
            groups.notes.append(f"cannot read this process's control groups: {exc}")
            return groups
        global _cgroup_serial
        with _cgroup_lock:
            _cgroup_serial += 1
            name = f"r{os.getpid()}-{_cgroup_serial}-{os.urandom(3).hex()}"
        for controller in _CGROUP_CONTROLLERS:
            if controller in places.v1:
                try:
                    groups.v1[controller] = _make_child(places.v1[controller], name)
                    groups._apply_v1(controller)
                except OSError as exc:
                    groups.notes.append(f"cgroup v1 {controller}: {exc}")
                    groups._remove_one(groups.v1.pop(controller, None))
        own, available = places.v2, places.v2_controllers
        delegated = os.environ.get(CGROUP_DELEGATED_ENV, "")
        if delegated and places.v2 is not None:
            own = Path(delegated)
            try:
                available = frozenset((own / "cgroup.controllers").read_text().split())
            except OSError as exc:
                groups.notes.append(f"{CGROUP_DELEGATED_ENV}={delegated}: {exc}")
                available = frozenset()
        wanted = {"pids", "memory"} & available - set(groups.v1)
        if own is not None and (wanted or "cpuacct" not in groups.v1):
            groups._make_v2(own, name, wanted)
        missing = {"pids", "memory"} - groups.controllers
        if missing:
            groups.notes.append(f"no usable {' or '.join(sorted(missing))} control group here")
        return groups

    def _make_v2(self, own: Path, name: str, wanted: set[str]) -> None:
        try:
            parent = own / CGROUP_FOLDER
            if wanted:
                enable = " ".join(f"+{c}" for c in sorted(wanted))
                (own / "cgroup.subtree_control").write_text(enable)
                parent.mkdir(exist_ok=True)
                (parent / "cgroup.subtree_control").write_text(enable)
            self.v2 = _make_child(own, name)
            self.v2_controllers = wanted | {"cpuacct"}  # cpu.stat is there without a controller
            if "pids" in wanted:
                (self.v2 / "pids.max").write_text(str(self._pids_max()))
            if "memory" in wanted:
                (self.v2 / "memory.max").write_text(str(self.limits.memory_mb << 20))
                with contextlib.suppress(FileNotFoundError):
                    (self.v2 / "memory.swap.max").write_text("0")
        except OSError as exc:
            # EBUSY: the worker's own group holds processes, so it may not hand controllers to
            # children (cgroup v2's rule): the operator delegates a subtree to the worker.
            hint = (f": set {CGROUP_DELEGATED_ENV} to a cgroup v2 folder that holds no process"
                    if exc.errno == errno.EBUSY else "")
            self.notes.append(f"cgroup v2 at {own}: {exc}{hint}")
            self._remove_one(self.v2)
            self.v2, self.v2_controllers = None, set()

    def _pids_max(self) -> int:
        return self.limits.processes + _OVERHEAD_PROCESSES

    def _apply_v1(self, controller: str) -> None:
        folder = self.v1[controller]
        if controller == "pids":
            (folder / "pids.max").write_text(str(self._pids_max()))
        elif controller == "memory":
            limit = str(self.limits.memory_mb << 20)
            (folder / "memory.limit_in_bytes").write_text(limit)
            with contextlib.suppress(FileNotFoundError):  # no swap accounting: nothing to cap
                (folder / "memory.memsw.limit_in_bytes").write_text(limit)

    def join_files(self) -> list[str]:
        files = [str(folder / "cgroup.procs") for folder in self.v1.values()]
        if self.v2 is not None:
            files.append(str(self.v2 / "cgroup.procs"))
        return files

    def _read(self, controller: str, v1_file: str, v2_file: str) -> str | None:
        try:
            if controller in self.v1:
                return (self.v1[controller] / v1_file).read_text()
            if self.v2 is not None and controller in self.v2_controllers:
                return (self.v2 / v2_file).read_text()
        except OSError:
            return None
        return None

    def processes_refused(self) -> int:
        """How many forks (and thread starts) the pids group refused."""
        return _field(self._read("pids", "pids.events", "pids.events"), "max")

    def oom_kills(self) -> int:
        """How many processes the kernel killed at the memory limit."""
        return _field(self._read("memory", "memory.oom_control", "memory.events"), "oom_kill")

    def memory_peak_mb(self) -> int | None:
        text = self._read("memory", "memory.max_usage_in_bytes", "memory.peak")
        return int(text) >> 20 if text and text.strip().isdigit() else None

    def cpu_seconds(self) -> float | None:
        if "cpuacct" in self.v1:
            text = self._read("cpuacct", "cpuacct.usage", "")
            return int(text) / 1e9 if text and text.strip().isdigit() else None
        text = self._read("cpuacct", "", "cpu.stat")
        return _field(text, "usage_usec") / 1e6 if text else None

    def members(self) -> list[int]:
        for folder in [*self.v1.values(), *([self.v2] if self.v2 is not None else [])]:
            try:
                return [int(v) for v in (folder / "cgroup.procs").read_text().split()]
            except OSError:
                continue
        return []

    def empty(self) -> None:
        """SIGKILL whatever is still in the groups (the pid namespace should have ended it)."""
        deadline = time.monotonic() + _LEFTOVER_WAIT_SECONDS
        while (members := self.members()) and time.monotonic() < deadline:
            log.error("sandbox processes %s outlived their run; killing them", members)
            if self.v2 is not None and (self.v2 / "cgroup.kill").exists():
                with contextlib.suppress(OSError):
                    (self.v2 / "cgroup.kill").write_text("1")
            for pid in members:
                self._kill_member(pid)
            time.sleep(0.05)

    def _kill_member(self, pid: int) -> None:
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            return
        try:  # still listed after the pidfd was taken: not a recycled pid of someone else
            if pid in self.members():
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        except ProcessLookupError:
            pass
        finally:
            os.close(pidfd)

    def remove(self) -> None:
        """Remove the groups; an exiting process can keep a group busy for a moment."""
        for folder in [*self.v1.values(), *([self.v2] if self.v2 is not None else [])]:
            self._remove_one(folder)
        self.v1, self.v2, self.v2_controllers = {}, None, set()

    @staticmethod
    def _remove_one(folder: Path | None) -> None:
        if folder is None:
            return
        deadline = time.monotonic() + _CGROUP_REMOVE_SECONDS
        while True:
            try:
                folder.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError as exc:
                if time.monotonic() >= deadline:
                    log.error("cannot remove the control group %s: %s", folder, exc)
                    return
                time.sleep(0.02)


def _make_child(own: Path, name: str) -> Path:
    parent = own / CGROUP_FOLDER
    parent.mkdir(exist_ok=True)
    _sweep(parent)
    child = parent / name
    child.mkdir()
    return child


def _sweep(parent: Path) -> None:
    """End the groups of runs whose worker process is gone (killed before it removed them)."""
    with contextlib.suppress(OSError):
        for entry in parent.iterdir():
            owner = entry.name[1:].split("-", 1)[0]
            if not (entry.name.startswith("r") and owner.isdigit()) or int(owner) == os.getpid():
                continue
            try:
                os.kill(int(owner), 0)
            except ProcessLookupError:
                _end_stale_group(entry)
            except PermissionError:
                pass


def _end_stale_group(folder: Path) -> None:
    """SIGKILL what a dead worker's run left in its group, then remove the group. The parent-
    death signals end a run with its worker, but not a bubblewrap child created a moment before
    it armed `--die-with-parent`: that one waits on its eventfd for ever, under init."""
    deadline = time.monotonic() + _CGROUP_REMOVE_SECONDS
    while time.monotonic() < deadline:
        try:
            members = [int(v) for v in (folder / "cgroup.procs").read_text().split()]
        except OSError:
            return  # removed meanwhile (by another worker's sweep)
        for pid in members:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        try:
            folder.rmdir()
            return
        except OSError:
            time.sleep(0.02)
    log.error("cannot end the control group %s of a dead worker's run", folder)


def _field(text: str | None, name: str) -> int:
    """The number after `name` in a flat-keyed cgroup file (pids.events, memory.events...)."""
    for line in (text or "").splitlines():
        key, _, value = line.partition(" ")
        if key == name and value.strip().isdigit():
            return int(value)
    return 0


def sandbox_containment() -> str:
    """One sentence: how processes and memory of a run are limited on this host (made by
    starting nothing: it makes and removes an empty group)."""
    groups = _Cgroups.make(SandboxLimits())
    try:
        have = groups.controllers
    finally:
        groups.remove()
    parts = []
    parts.append("processes per sandbox (pids control group)" if "pids" in have else
                 "processes per uid (RLIMIT_NPROC), a uid per experiment from the pool")
    parts.append("memory per sandbox (memory control group)" if "memory" in have else
                 "memory per process only (RLIMIT_AS)")
    note = f" ({'; '.join(groups.notes)})" if groups.notes else ""
    return "Limits: " + ", ".join(parts) + ", disk per sandbox (size checks)" + note + "."


def _note_degraded(groups: _Cgroups) -> None:
    """Log once per distinct reason that runs go without a control group."""
    if not groups.notes:
        return
    note = "; ".join(groups.notes)
    with _cgroup_lock:
        if _cgroup_note == [note]:
            return
        _cgroup_note[:] = [note]
    shared = "pids" not in groups.controllers
    log.warning("sandbox control groups not fully usable (%s)%s", note,
                ": the process limit is per uid (a uid per experiment where the pool is set)"
                if shared else "")


# --------------------------------------------------------------------------- disk use

_DISK_CHECK_SECONDS: Final = 0.5
_DISK_MAX_SHARE: Final = 0.05  # of the run's wall time spent measuring, at most
_DISK_MAX_ENTRIES: Final = 500_000


class _DiskMeter:
    """What a run added to its work tree and output folder: allocated blocks of every file
    (hard links once, symlinks not followed, the read-only top-level .git skipped) and of
    deleted files its processes still hold open, less what was there at the start."""

    def __init__(self, spec: SandboxSpec) -> None:
        self.roots = (spec.workdir, spec.out_dir)
        self.devices = {root.stat().st_dev for root in self.roots}
        self.limit = spec.limits.disk_mb << 20
        self.start = 0
        self.start = self.measure([])
        self.peak = 0
        self.next_check = time.monotonic() + _DISK_CHECK_SECONDS

    def measure(self, pids: Sequence[int]) -> int:
        seen: set[tuple[int, int]] = set()
        total = 0
        for root in self.roots:
            total += self._walk(root, seen, skip_git=root == self.roots[0])
        for pid in pids:
            total += self._open_deleted(pid, seen)
        return max(total - self.start, 0)

    def _walk(self, root: Path, seen: set[tuple[int, int]], *, skip_git: bool) -> int:
        total, stack, entries = 0, [str(root)], 0
        while stack and entries < _DISK_MAX_ENTRIES:
            folder = stack.pop()
            try:
                with os.scandir(folder) as listing:
                    for entry in listing:
                        entries += 1
                        if skip_git and folder == str(root) and entry.name == ".git":
                            continue
                        try:
                            info = entry.stat(follow_symlinks=False)
                        except OSError:
                            continue
                        if stat.S_ISDIR(info.st_mode):
                            stack.append(entry.path)
                        key = (info.st_dev, info.st_ino)
                        if key not in seen:
                            seen.add(key)
                            total += info.st_blocks * 512
            except OSError:
                continue
        return total

    def _open_deleted(self, pid: int, seen: set[tuple[int, int]]) -> int:
        total = 0
        with contextlib.suppress(OSError):
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                try:
                    info = fd.stat()  # the open file itself
                except OSError:
                    continue
                key = (info.st_dev, info.st_ino)
                if (stat.S_ISREG(info.st_mode) and info.st_nlink == 0
                        and info.st_dev in self.devices and key not in seen):
                    seen.add(key)
                    total += info.st_blocks * 512
        return total

    def check(self, now: float, pids: Callable[[], Sequence[int]]) -> int | None:
        """The bytes added, when a check is due and found more than the limit; else None."""
        if now < self.next_check:
            return None
        began = time.monotonic()
        used = self.measure(pids())
        spent = time.monotonic() - began
        self.peak = max(self.peak, used)
        self.next_check = now + max(_DISK_CHECK_SECONDS, spent / _DISK_MAX_SHARE)
        return used if used > self.limit else None


def _megabytes(count: int) -> str:
    """1 MB is 2**20 bytes here, as in the limits."""
    if count >= 10 << 30:
        return f"{count / (1 << 30):.0f} GB"
    if count >= 1 << 30:
        return f"{count / (1 << 30):.1f} GB"
    if count >= 10 << 20:
        return f"{count / (1 << 20):.0f} MB"
    return f"{count / (1 << 20):.1f} MB"


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
    seen: int = 0

    def feed(self, chunk: bytes) -> bytes:
        """Record chunk; return the part of it that is kept."""
        kept = chunk[: max(self.limit - len(self.kept), 0)]
        self.kept += kept
        self.seen += len(chunk)
        self.truncated = self.truncated or len(kept) < len(chunk)
        self.tail = (self.tail + chunk)[-_TAIL_BYTES:]
        return kept

    def cut(self) -> str:
        """'' or where the kept output ends, e.g. 'stdout cut at 1 MB of 3.2 MB'."""
        if not self.truncated:
            return ""
        return f"{self.name} cut at {_output_size(len(self.kept))} of {_output_size(self.seen)}"


def _output_size(count: int) -> str:
    """Decimal units, as output_bytes is given (1_000_000 is '1 MB')."""
    for unit, size in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if count >= size:
            return f"{count / size:.1f}".removesuffix(".0") + f" {unit}"
    return f"{count} bytes"


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


_LIMIT_CHECK_SECONDS: Final = 0.25


@dataclass(frozen=True)
class _Hit:
    """A limit the run hit: its reason, a phrase, and when (seconds after the start; None when
    the phrase says it, or when it was read from the output at the end)."""

    reason: str
    detail: str
    at: float | None


class _Run:
    """Pumps one started sandbox's output until it ends or its deadline passes, watching its
    control groups and its disk use meanwhile."""

    def __init__(self, spec: SandboxSpec, on_output: Callable[[str, bytes], None] | None,
                 groups: _Cgroups | None = None, disk: _DiskMeter | None = None) -> None:
        self.spec = spec
        self.on_output = on_output
        self.stdout = _Capture("stdout", spec.limits.output_bytes)
        self.stderr = _Capture("stderr", spec.limits.output_bytes)
        self.status = _Status()
        self.namespace: _Namespace | None = None
        self.groups = groups
        self.disk = disk
        self.hits: list[_Hit] = []
        self.started = time.monotonic()
        self.killed = False  # by us: the timeout or a limit we enforce by watching
        self.timed_out = False

    def pump(self, process: subprocess.Popen[bytes], status_fd: int, deadline: float) -> None:
        assert process.stdout is not None and process.stderr is not None
        readers: dict[int, Callable[[bytes], None]] = {
            process.stdout.fileno(): lambda chunk: self._keep(self.stdout, chunk),
            process.stderr.fileno(): lambda chunk: self._keep(self.stderr, chunk),
            status_fd: self._on_status,
        }
        watching = self.groups is not None or self.disk is not None
        next_check = time.monotonic() + _LIMIT_CHECK_SECONDS
        with selectors.DefaultSelector() as selector:
            for fd in readers:
                selector.register(fd, selectors.EVENT_READ)
            while selector.get_map():
                now = time.monotonic()
                if watching and now >= next_check and not self.killed:
                    self._watch(process, now)
                    next_check = now + _LIMIT_CHECK_SECONDS
                if now >= deadline:
                    if self.timed_out:
                        return
                    self._watch(process, now)  # a limit hit just before counts as before
                    self.timed_out = True
                    self._hit(REASON_TIMEOUT, f"killed after {now - self.started:.1f} s "
                                              "wall-clock timeout", timed=False)
                    self._stop(process)
                    deadline = now + _KILL_GRACE_SECONDS
                wait = deadline - now
                if watching and not self.killed:
                    wait = min(wait, next_check - now)
                for key, _ in selector.select(timeout=max(wait, 0.0)):
                    chunk = os.read(key.fd, _CHUNK)
                    if chunk:
                        readers[key.fd](chunk)
                    else:
                        selector.unregister(key.fd)
                if self.killed and not self.timed_out and deadline - time.monotonic() > \
                        _KILL_GRACE_SECONDS:
                    deadline = time.monotonic() + _KILL_GRACE_SECONDS

    def _hit(self, reason: str, detail: str, *, timed: bool = True) -> None:
        """Record a limit once, at the first time it was seen."""
        if all(hit.reason != reason for hit in self.hits):
            at = time.monotonic() - self.started
            self.hits.append(_Hit(reason, detail, at if timed else None))

    def _watch(self, process: subprocess.Popen[bytes] | None, now: float) -> None:
        """Read the groups' counters and the disk use; stop the run at a limit it crossed."""
        limits = self.spec.limits
        if self.groups is not None:
            refused = self.groups.processes_refused()
            if refused:
                self._hit(REASON_PROCESSES, f"could not start a process under the "
                                            f"{limits.processes}-process limit of this sandbox")
            if self.groups.oom_kills():
                self._hit(REASON_MEMORY, f"killed by the kernel at the {limits.memory_mb} MB "
                                         "memory limit of this sandbox")
            if limits.total_cpu_seconds is not None:
                used = self.groups.cpu_seconds()
                if used is not None and used > limits.total_cpu_seconds:
                    self._hit(REASON_CPU, f"stopped after {used:.1f} s of CPU time, over the "
                                          f"{limits.total_cpu_seconds} s limit of this sandbox")
                    self._stop(process)
        if self.disk is not None:
            over = self.disk.check(now, self._members)
            if over is not None:
                verb = "wrote" if process is None else "stopped after writing"  # None: at the end
                self._hit(REASON_DISK, f"{verb} {_megabytes(over)} to its work tree and output, "
                                       f"over the {limits.disk_mb} MB disk limit")
                self._stop(process)

    def _members(self) -> Sequence[int]:
        if self.groups is not None and self.groups.controllers & {"pids", "memory"}:
            return self.groups.members()
        if self.namespace is not None and not self.namespace.ended():
            return self.namespace.members()
        return []

    def _keep(self, capture: _Capture, chunk: bytes) -> None:
        kept = capture.feed(chunk)
        if kept and self.on_output is not None:
            self.on_output(capture.name, kept)

    def _on_status(self, chunk: bytes) -> None:
        self.status.feed(chunk)
        init_pid, ns_inode = self.status.value("child-pid"), self.status.value("pid-namespace")
        if self.namespace is None and init_pid is not None and ns_inode is not None:
            self.namespace = _Namespace.pin(init_pid, ns_inode)

    def _stop(self, process: subprocess.Popen[bytes] | None) -> None:
        """Kill the run (the timeout, or a limit we enforce by watching)."""
        if self.killed or process is None:
            return
        self.killed = True
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
        if self.killed:
            _kill_group(process)
        _, wait_status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(wait_status)
        wall = time.monotonic() - started
        if self.namespace is not None:
            self.namespace.ensure_empty()
        if self.groups is not None:
            self.groups.empty()
        exit_code = self.status.value("exit-code")
        if exit_code is None and not self.killed:
            return self._setup_failure(wall)
        if self.disk is not None:
            self.disk.next_check = 0.0  # the last word: what the run left
        self._watch(None, time.monotonic())
        return _classify(
            self.spec.limits, exit_code=None if self.killed else exit_code,
            cpu_seconds=usage.ru_utime + usage.ru_stime, wall=wall,
            stdout=self.stdout, stderr=self.stderr, hits=self.hits,
            shared_processes=self.groups is None or "pids" not in self.groups.controllers,
        )

    def _setup_failure(self, wall: float) -> SandboxResult:
        """The command never started: fail closed, except that running out of processes of the
        sandbox uid (or of the run's pids group) is the run's limit rather than a broken host."""
        lines = bytes(self.stderr.kept).decode("utf-8", "replace").strip().splitlines()
        message = lines[-1] if lines else "bwrap exited without starting the command"
        if "Resource temporarily unavailable" in message:
            shared = self.groups is None or "pids" not in self.groups.controllers
            whose = " (shared by every sandbox of this uid)" if shared else ""
            return SandboxResult(
                exit_code=None, reason=REASON_PROCESSES,
                detail=f"the sandbox could not start under the {self.spec.limits.processes}-"
                       f"process limit{whose}: {message}", stdout=b"",
                stderr=bytes(self.stderr.kept), output_truncated=False, wall_seconds=wall,
                limits_hit=(REASON_PROCESSES,), stderr_bytes=self.stderr.seen,
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

    on_output runs on the calling thread and must return quickly: the wall-clock timeout and the
    limits are checked between chunks. Returns only once every process of the run has ended and
    its control groups are removed. Raises ValueError for a spec whose host paths do not exist."""
    _validate(spec)
    chosen = _run_identity(identity)
    groups = _Cgroups.make(spec.limits)
    _note_degraded(groups)
    if spec.limits.address_space_mb is None and "memory" not in groups.controllers:
        groups.remove()
        raise SandboxUnavailable(
            "A probe without an address-space limit (one on an accelerator) needs a memory "
            "control group to bound its memory, and none can be made here: run the worker as "
            f"root, and where its own cgroup v2 group holds processes, set "
            f"{CGROUP_DELEGATED_ENV} to a group that holds none.")
    status_read, status_write = os.pipe()
    run: _Run | None = None
    try:
        run = _Run(spec, on_output, groups, _DiskMeter(spec))
        argv = _launch_argv(spec, chosen, status_write, groups)
        started = time.monotonic()
        run.started = started
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
        if run is not None:
            run.close()
        groups.empty()
        groups.remove()
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
    stdout: _Capture, stderr: _Capture, hits: Sequence[_Hit] = (), shared_processes: bool = True,
) -> SandboxResult:
    """The run's reason: the first limit it hit (in the order they happened), else how the
    command ended. detail names every limit hit with when, then the end, then any output cut."""
    ending, ending_detail = _reason(limits, exit_code, cpu_seconds, wall, stderr.tail.lower())
    if ending == REASON_PROCESSES and shared_processes:
        # Without a pids group the count is the uid's: another run may have spent it.
        ending_detail = (f"could not start a process under the {limits.processes}-process limit "
                         "of the sandbox uid, shared by every sandbox running now")
    hits = list(hits)
    known = {hit.reason for hit in hits}
    if ending not in (REASON_OK, REASON_EXIT, REASON_SIGNAL, REASON_TIMEOUT) and (
            ending not in known):
        hits.append(_Hit(ending, ending_detail, None))  # seen at the end, in the output
    phrases = [hit.detail if hit.at is None else f"{hit.detail} (at {hit.at:.1f} s)"
               for hit in hits]
    if exit_code is not None and (not hits or ending in (REASON_OK, REASON_EXIT, REASON_SIGNAL)):
        phrases.append(ending_detail)
    reason = ending
    if hits and (ending != REASON_OK or any(hit.reason in _ENFORCED for hit in hits)):
        reason = hits[0].reason
    cuts = [cut for cut in (stdout.cut(), stderr.cut()) if cut]
    detail = "; then ".join(phrases)
    if cuts:
        detail += "; " + ", ".join(cuts)
    return SandboxResult(
        exit_code=exit_code, reason=reason, detail=detail, stdout=bytes(stdout.kept),
        stderr=bytes(stderr.kept), output_truncated=stdout.truncated or stderr.truncated,
        wall_seconds=wall, limits_hit=tuple(hit.reason for hit in hits),
        stdout_bytes=stdout.seen, stderr_bytes=stderr.seen,
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
        if limits.address_space_mb is None:
            return REASON_MEMORY, (f"ran out of memory: the sandbox's {limits.memory_mb} MB, "
                                   "or the accelerator's own memory, which it does not limit")
        return REASON_MEMORY, f"ran out of memory under the {limits.address_space_mb} MB limit"
    if _has(tail, _PROCESS_SIGNATURES):
        return REASON_PROCESSES, f"could not start a process under the {limits.processes} limit"
    if signum is not None:
        name = signal.Signals(signum).name
        return REASON_SIGNAL, f"killed by {name} (exit status {exit_code})"
    return REASON_EXIT, f"exited with status {exit_code}"


def _has(tail: bytes, signatures: Sequence[bytes]) -> bool:
    return any(signature in tail for signature in signatures)
