"""Who a sandbox runs as: the dedicated non-root user (:func:`sandbox_identity`), a uid of the
pool leased to one experiment (:func:`sandbox_identity_lease`), and for one run the identity it
may take, given who the service is (:func:`_run_identity`)."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import pwd
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from infraops.experiments.sandbox.cgroups import _Cgroups
from infraops.experiments.sandbox.config import (
    _LEFTOVER_WAIT_SECONDS,
    SandboxIdentity,
    SandboxLimits,
    SandboxUnavailable,
)
from infraops.experiments.sandbox.mounts import _etc_parent

log = logging.getLogger("infraops.experiments.sandbox")  # one logger for the package

SANDBOX_USER = "infraops-sandbox"
FALLBACK_USER = "nobody"
_ID_MAX: Final = (1 << 32) - 1


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
