"""The sandbox supervisor in Python: the same program as supervisor.c beside it (which
scripts/setup.sh compiles into .venv/bin/infraops-sandbox-supervisor, about 25 ms faster to
start), run where that one is missing.

It runs outside the sandbox, as the service's direct child: it becomes a child subreaper so that
bwrap's orphaned init is reaped here, applies the rlimits, the sandbox identity (when started as
root) and no_new_privs in its child, which then becomes bwrap, and exits with bwrap's status
(128+N for signal N). When it cannot, it writes one line "infraops-sandbox: ..." to stderr and
exits 125.

argv: parent pid, rlimits "cpu,as,fsize,nproc" (as 0: no address-space limit), status fd,
identity "uid:gid" or "-", command...

Never imported by the service: launch.py passes this file's text to ``python -I -S -c``, where
nothing of the service's environment or import path is loaded. So it uses the standard library
only, and no more of it than before: every module imported here adds to the start of every
sandbox (hence no ``typing`` at run time, and ``open`` rather than ``pathlib``).
"""

from __future__ import annotations

import ctypes
import errno
import os
import resource
import signal
import sys

TYPE_CHECKING = False  # mypy takes it as true; importing typing would cost every start
if TYPE_CHECKING:
    from typing import NoReturn

PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_GET_SECUREBITS, PR_SET_CHILD_SUBREAPER = 1, 24, 27, 36
PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 38, 47, 4
SYS_CAPSET = {"x86_64": 126, "aarch64": 91}.get(os.uname().machine)
FAILED = 125

libc = ctypes.CDLL(None, use_errno=True)


def fail(message: str) -> NoReturn:
    sys.stderr.write("infraops-sandbox: " + message + "\n")
    os._exit(FAILED)


def become(uid: int, gid: int) -> None:
    """Switch to uid and gid for good: no capability (bounding, ambient, inheritable, permitted,
    effective), no supplementary group; fail unless the switch is verified."""
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
    with open("/proc/self/status") as status:  # noqa: PTH123  (see the module's docstring)
        caps = [line.split()[1] for line in status if line.startswith(("CapInh", "CapPrm",
                                                                        "CapEff", "CapAmb"))]
    if (os.getresuid() != (uid,) * 3 or os.getresgid() != (gid,) * 3 or os.getgroups()
            or len(caps) != 4 or any(int(c, 16) for c in caps)):
        fail("the switch to the sandbox user did not take")


def limit(which: int, soft: int, hard: int) -> None:
    """Set an rlimit, never above the hard limit we were given."""
    current = resource.getrlimit(which)[1]
    if current != resource.RLIM_INFINITY:
        soft, hard = min(soft, current), min(hard, current)
    resource.setrlimit(which, (soft, hard))


def start_child(
    supervisor: int, rlimits: tuple[int, int, int, int], identity: str, argv: list[str],
) -> NoReturn:
    """In the forked child: confine this process, then become argv (bwrap)."""
    cpu, address_space, file_size, processes = rlimits
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
            os._exit(FAILED)
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            fail("cannot set no_new_privs")
        os.execv(argv[0], argv)  # noqa: S606  (bwrap, by the absolute path the service resolved)
    except BaseException as exc:
        fail(f"cannot start {argv[0]}: {exc}")


def reap(pid: int) -> int:
    """Wait until no child is left (bwrap and whatever is reparented to us, its init included);
    pid's exit status, 128+N for signal N."""
    status = 0
    while True:
        try:
            child, child_status = os.wait()
        except ChildProcessError:
            break
        if child == pid:
            status = child_status
    code = os.waitstatus_to_exitcode(status)
    return code if code >= 0 else 128 - code


def main() -> NoReturn:
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != int(sys.argv[1]):
        fail("the service exited before the sandbox started")
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        fail("cannot become a child subreaper")
    cpu, address_space, file_size, processes = (int(v) for v in sys.argv[2].split(","))
    status_fd, identity, argv = int(sys.argv[3]), sys.argv[4], sys.argv[5:]
    supervisor = os.getpid()
    pid = os.fork()
    if pid == 0:
        start_child(supervisor, (cpu, address_space, file_size, processes), identity, argv)
    os.close(status_fd)
    sys.exit(reap(pid))


if __name__ == "__main__":
    main()
