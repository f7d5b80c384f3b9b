"""What a dead pool process leaves behind is killed by the worker's main process.

A prefork worker runs experiments in pool processes. When one of them dies (SIGKILL, the OOM
killer), the parent-death signals down its tree end the probe supervisor and, through it,
bubblewrap. Not always: bubblewrap arms `--die-with-parent` in its sandboxed child a moment
after creating it, so a supervisor killed in that moment leaves the child blocked forever on
a pipe no one will write, outside any process we watch. Git commands a pool process ran have
no parent-death signal at all.

So the main process is made a child subreaper (prctl PR_SET_CHILD_SUBREAPER): orphans of its
descendants become its children instead of init's. Those children are of two kinds only:
pool processes (forks of the main process, listed by the pool) and orphans. An `OrphanReaper`
thread kills every orphan's tree and reaps it within a few seconds. A child is taken for an
orphan only when two sweeps in a row found it outside the pool's list (a pool process the pool
is forking now is listed by the next sweep) and it is not a fork of the main process. Zombies
it did not kill are reaped only after they have stayed unclaimed for a while: a pool process
that just died is the pool's to reap (its exit status tells Celery what happened).
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Callable
from contextlib import suppress

import psutil

from infraops.experiments.workers import Periodic

log = logging.getLogger(__name__)

PR_SET_CHILD_SUBREAPER = 36
ORPHAN_ROUNDS = 2  # sweeps in a row outside the pool's list before a child is an orphan
UNCLAIMED_ZOMBIE_ROUNDS = 10  # a zombie nobody reaps for this many sweeps is ours to reap


def become_subreaper() -> bool:
    """Make this process the reaper of its descendants' orphans. False where the kernel
    refuses (not Linux, or older than 3.4): orphans then go to init as before."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


class OrphanReaper(Periodic):
    """Kills and reaps this process's children that are neither in `keep()` (the pool's
    processes) nor forks of this process (same command line), every `interval` seconds."""

    thread_name = "infraops-orphans"

    def __init__(self, keep: Callable[[], set[int]], interval: float = 1.0) -> None:
        super().__init__(interval)
        self.keep = keep
        self.killed: list[str] = []  # one line per orphan killed, for tests and the log
        self._killed_pids: set[int] = set()
        self._suspect_rounds: dict[int, int] = {}  # live children outside the pool's list
        self._zombie_rounds: dict[int, int] = {}

    def tick(self) -> None:
        self.sweep()

    def sweep(self) -> None:
        """One round: kill live orphans, reap dead ones."""
        me = psutil.Process()
        own_command = me.cmdline()
        children = me.children()
        keep = self.keep()  # read after listing: a pool process forked meanwhile is kept
        suspects, zombies = set(), set()
        for child in children:
            if child.pid in keep:
                continue
            with suppress(psutil.Error):
                if child.status() == psutil.STATUS_ZOMBIE:
                    zombies.add(child.pid)
                elif child.cmdline() != own_command:
                    suspects.add(child.pid)
                    if _counted(self._suspect_rounds, child.pid) >= ORPHAN_ROUNDS:
                        self._kill(child)
        for pid in zombies:
            rounds = _counted(self._zombie_rounds, pid)
            if pid in self._killed_pids or rounds >= UNCLAIMED_ZOMBIE_ROUNDS:
                self._reap(pid)
        _forget_all_but(self._suspect_rounds, suspects)
        _forget_all_but(self._zombie_rounds, zombies)

    def _kill(self, orphan: psutil.Process) -> None:
        tree = [orphan, *orphan.children(recursive=True)]
        line = f"{orphan.pid} {' '.join(orphan.cmdline())[:200]}"
        for process in tree:
            with suppress(psutil.Error):
                process.kill()
        self._killed_pids.add(orphan.pid)
        self.killed.append(line)
        log.warning("killed a process left behind by a dead pool process: %s", line)

    def _reap(self, pid: int) -> None:
        with suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        self._killed_pids.discard(pid)
        self._zombie_rounds.pop(pid, None)


def _counted(rounds: dict[int, int], pid: int) -> int:
    rounds[pid] = rounds.get(pid, 0) + 1
    return rounds[pid]


def _forget_all_but(rounds: dict[int, int], present: set[int]) -> None:
    for pid in set(rounds) - present:
        del rounds[pid]
