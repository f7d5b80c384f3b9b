"""The disk a run uses where no scratch can be mounted (a worker not run as root): what it
added to its work tree and output folder, measured while it runs (:class:`_DiskMeter`),
against its disk_mb. The walk stops at _DISK_MAX_ENTRIES, so a run that makes more entries
than that can hide bytes behind them: as root, scratch.py has the kernel hold the limit."""

from __future__ import annotations

import contextlib
import os
import stat
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

from infraops.experiments.sandbox.config import SandboxSpec

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
