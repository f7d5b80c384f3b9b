"""How a sandbox's process tree is started: the supervisor (compiled, or the Python one in
supervisor.py), inside the run's control groups, then bwrap, as one argv for :func:`_start`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Final

from infraops.experiments.sandbox.cgroups import _Cgroups
from infraops.experiments.sandbox.config import SandboxIdentity, SandboxSpec, SandboxUnavailable
from infraops.experiments.sandbox.mounts import _bwrap_argv

BWRAP = "bwrap"
_NOT_INSTALLED: Final = "bubblewrap (bwrap) is not installed"
# The supervisor compiled from supervisor.c (beside this file) by scripts/setup.sh: the same
# program as supervisor.py, about 25 ms faster to start. Without it, the Python one.
SUPERVISOR_BINARY = Path(sys.executable).with_name("infraops-sandbox-supervisor")
# The Python supervisor's source, given to the interpreter with -c: it runs isolated (-I -S),
# where this package is not importable.
_SUPERVISOR: Final = (Path(__file__).parent / "supervisor.py").read_text()
# The PATH bwrap is looked up on and the supervisor is given: a fixed one, never the service's.
_HOST_PATH: Final = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# With a pids group the per-uid RLIMIT_NPROC would make concurrent runs share one count again:
# it is raised to this (the pids group is the limit then).
_UID_PROCESS_CAP: Final = 1 << 20
# Joins the groups named before "--" (their cgroup.procs files), then becomes the supervisor:
# every process of the run is born inside them.
_JOIN: Final = (
    'while [ "$1" != -- ]; do echo $$ > "$1" 2>/dev/null || { '
    'echo "infraops-sandbox: cannot join the control group $1" >&2; exit 125; }; shift; done; '
    'shift; exec "$@"'
)


def _resolve(program: str, missing: str) -> str:
    found = shutil.which(program, path=_HOST_PATH)
    if found is None:
        raise SandboxUnavailable(missing)
    return found


def _launch_argv(
    spec: SandboxSpec, identity: SandboxIdentity, status_fd: int, groups: _Cgroups | None = None,
) -> list[str]:
    """The argv that starts spec's run: [the cgroup join,] the supervisor, then bwrap. Raises
    SandboxUnavailable when bwrap is not installed."""
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


def _start(argv: list[str], status_fd: int) -> subprocess.Popen[bytes]:
    """Start argv in a session and process group of its own, with a bare environment and
    status_fd passed on. Raises SandboxUnavailable when it cannot start."""
    try:
        return subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            pass_fds=(status_fd,), start_new_session=True, cwd="/",
            env={"PATH": _HOST_PATH, "LANG": "C.UTF-8"},
        )
    except OSError as exc:
        raise SandboxUnavailable(f"The sandbox supervisor could not start: {exc}.") from exc
