"""The contract of one sandbox run: what it is given (:class:`SandboxSpec` with its
:class:`SandboxLimits`, the :class:`SandboxIdentity` it runs as), what it gives back
(:class:`SandboxResult`, its reason one of the ``REASON_*`` names), and
:class:`SandboxUnavailable`, raised whenever a run cannot be confined. Plain data, no I/O."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

REASON_OK: Final = "ok"
REASON_EXIT: Final = "exit"
REASON_TIMEOUT: Final = "timeout"
REASON_CPU: Final = "cpu-limit"
REASON_MEMORY: Final = "memory-limit"
REASON_FILE_SIZE: Final = "file-size-limit"
REASON_PROCESSES: Final = "process-limit"
REASON_DISK: Final = "disk-limit"
REASON_SIGNAL: Final = "signal"
# Processes found left over after a run (or still running under a leased uid) get this long to
# die after SIGKILL before they are logged and given up on.
_LEFTOVER_WAIT_SECONDS: Final = 2.0


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
    memory control group; not enforced without one). disk_mb and inodes are the bytes and the
    files and folders the run may write to its work tree and output folder (a changed file
    counts whole; files it deleted while still holding them open count). Run as root, the kernel
    enforces both, on a sized tmpfs of the run's own (scratch.py) whose pages also count toward
    memory_mb; otherwise disk_mb is measured every disk._DISK_CHECK_SECONDS and inodes is not
    enforced. total_cpu_seconds, when set, is the CPU time of every process of the run together
    (a cpuacct control group)."""

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
    # Files and folders: each costs the kernel about 1 KiB that no byte count sees, and the
    # host walks every one a run leaves (scratch.py says more).
    inodes: int = 100_000
    total_cpu_seconds: int | None = None


@dataclass(frozen=True)
class SandboxMaxima:
    """The operator's ceilings on what one probe may ask for (settings.SANDBOX_MAX_*)."""

    processes: int = 1024
    memory_mb: int = 8192
    disk_mb: int = 8192
    inodes: int = 100_000  # not asked for by a probe: every execution gets this many


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
    return SandboxLimits(wall_seconds=wall_seconds, inodes=maxima.inodes, **chosen)


@dataclass(frozen=True)
class SandboxIdentity:
    """The uid and gid a sandbox runs as (never root's: see uids._run_identity)."""

    uid: int
    gid: int


@dataclass(frozen=True)
class SandboxSpec:
    """What to run. command runs as ``/bin/sh -c command`` in /work. env is added to PATH, HOME
    and LANG (it may override those three) and INFRAOPS_OUT=/out (it may not). Every host path
    must exist; readonly_binds targets are absolute paths inside the sandbox. devices are
    accelerator device nodes (see :func:`accelerator_device`), each at its own path inside.

    keep_workdir False: what the run writes to its work tree is thrown away when it ends (the
    output folder is kept either way), so the next run finds the tree as this one found it."""

    command: str
    workdir: Path
    out_dir: Path
    env: Mapping[str, str]
    readonly_binds: Sequence[tuple[Path, str]] = ()
    limits: SandboxLimits = SandboxLimits()
    devices: Sequence[Path] = ()
    keep_workdir: bool = True


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
