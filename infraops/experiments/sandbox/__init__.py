"""The only package in the product that starts probe subprocesses.

Every probe command runs under bubblewrap, as a dedicated non-root uid, with every namespace
unshared, a cleared environment, rlimits, a wall-clock timeout and capped output. The sandbox
fails closed: when a confined process cannot be started, :class:`SandboxUnavailable` is raised
and the command never runs. Nothing here imports Django.

Inside the sandbox the filesystem is built from nothing: ``/usr`` (and the ``/bin``, ``/lib``
links) read-only, an ``/etc`` holding copies of a few harmless files, fresh ``/proc`` and ``/dev``,
tmpfs ``/tmp``, ``/var``, ``/run``, ``/home`` and ``/root``, the worktree read-write at
``/work`` (its ``.git`` read-only), the output folder read-write at ``/out`` and the caller's
read-only binds. What a run writes to ``/work`` and ``/out`` lands on a tmpfs of its own, sized
in bytes and in files (``scratch``), and is copied onto the host folders when it ends.
Everything else on the host (the service's checkout, its data folder, the PostgreSQL and Redis
sockets, ``/etc/shadow``) is absent. A probe that needs an accelerator is
given its device nodes, and nothing else of the host's ``/dev`` (:func:`accelerator_device`).

Process tree of one run::

    supervisor (python, child subreaper)  <- our Popen, its own session and process group
      bwrap                               <- outside the sandbox, as the sandbox uid
        bwrap init, pid 1                 <- inside the pid namespace
          /bin/sh -c COMMAND

The supervisor exists because bwrap exits as soon as the command exits, orphaning its init
process; reparented to the host's pid 1 (which may never reap), each run would leave a zombie of
the sandbox uid that counts against the process limit of every later run.

The modules, in the order a run meets them:

- ``config``: the contract (spec, limits, identity, result, reasons, SandboxUnavailable);
- ``check``: whether a sandbox can be made here at all;
- ``uids``: who a run is (the dedicated user, the uid leases);
- ``folders``: the work tree and output folder handed to that uid, and files read back;
- ``mounts`` and ``devices``: bwrap's command line, the /etc copy, the accelerator nodes;
- ``cgroups``: the run's control groups;
- ``launch``: the argv that starts it, through ``supervisor.py`` or ``supervisor.c``;
- ``runner``: running it to its end (:func:`sandbox_run`), with ``scratch`` (the disk it
  writes, limited by the kernel; as root), ``disk`` (the meter otherwise) and ``pid_namespace``;
- ``outcome``: its captured output and how it ended, as a :class:`SandboxResult`.

Names here are re-exports, to be read and called. The settings the code reads at each call
(``BWRAP``, ``SUPERVISOR_BINARY`` in ``launch``; ``CHECK_RETRY_DELAYS``,
``CHECK_FAILURE_SECONDS`` in ``check``) are changed or patched in their own module: a patch of
the copy here would be read by nothing.
"""

from __future__ import annotations

from infraops.experiments.sandbox.cgroups import (
    CGROUP_DELEGATED_ENV,
    CGROUP_FOLDER,
    sandbox_containment,
)
from infraops.experiments.sandbox.check import (
    CHECK_FAILURE_SECONDS,
    CHECK_RETRY_DELAYS,
    sandbox_check,
)
from infraops.experiments.sandbox.config import (
    REASON_CPU,
    REASON_DISK,
    REASON_EXIT,
    REASON_FILE_SIZE,
    REASON_MEMORY,
    REASON_OK,
    REASON_PROCESSES,
    REASON_SIGNAL,
    REASON_TIMEOUT,
    SandboxIdentity,
    SandboxLimits,
    SandboxMaxima,
    SandboxResult,
    SandboxSpec,
    SandboxUnavailable,
    probe_limits,
)
from infraops.experiments.sandbox.devices import accelerator_device
from infraops.experiments.sandbox.folders import sandbox_prepare_dir, sandbox_read_output
from infraops.experiments.sandbox.launch import BWRAP, SUPERVISOR_BINARY
from infraops.experiments.sandbox.mounts import SANDBOX_PATH
from infraops.experiments.sandbox.runner import sandbox_run
from infraops.experiments.sandbox.uids import (
    FALLBACK_USER,
    SANDBOX_USER,
    sandbox_identity,
    sandbox_identity_lease,
)

__all__ = [
    "BWRAP",
    "CGROUP_DELEGATED_ENV",
    "CGROUP_FOLDER",
    "CHECK_FAILURE_SECONDS",
    "CHECK_RETRY_DELAYS",
    "FALLBACK_USER",
    "REASON_CPU",
    "REASON_DISK",
    "REASON_EXIT",
    "REASON_FILE_SIZE",
    "REASON_MEMORY",
    "REASON_OK",
    "REASON_PROCESSES",
    "REASON_SIGNAL",
    "REASON_TIMEOUT",
    "SANDBOX_PATH",
    "SANDBOX_USER",
    "SUPERVISOR_BINARY",
    "SandboxIdentity",
    "SandboxLimits",
    "SandboxMaxima",
    "SandboxResult",
    "SandboxSpec",
    "SandboxUnavailable",
    "accelerator_device",
    "probe_limits",
    "sandbox_check",
    "sandbox_containment",
    "sandbox_identity",
    "sandbox_identity_lease",
    "sandbox_prepare_dir",
    "sandbox_read_output",
    "sandbox_run",
]
