"""A run's pid namespace, pinned (:class:`_Namespace`): how a run is killed whole, and how
its end is verified."""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from infraops.experiments.sandbox.config import _LEFTOVER_WAIT_SECONDS

log = logging.getLogger("infraops.experiments.sandbox")  # one logger for the package


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
