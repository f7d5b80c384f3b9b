"""How a run ended, in words: its captured output streams (:class:`_Capture`), the limits it
hit (:class:`_Hit`), and their classification into a :class:`SandboxResult`."""

from __future__ import annotations

import signal
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

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
    SandboxLimits,
    SandboxResult,
)

# The tail of stderr kept to classify how a run ended, whatever was kept of its head.
_TAIL_BYTES: Final = 8192
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
_DISK_SIGNATURES: Final = (b"no space left on device", b"disk quota exceeded")


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


@dataclass(frozen=True)
class _Hit:
    """A limit the run hit: its reason, a phrase, and when (seconds after the start; None when
    the phrase says it, or when it was read from the output at the end)."""

    reason: str
    detail: str
    at: float | None


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
    if _has(tail, _DISK_SIGNATURES):
        return REASON_DISK, (f"a write found no space left: the {limits.disk_mb} MB and "
                             f"{limits.inodes}-file disk limit of its work tree and output, or "
                             f"its /tmp ({limits.file_size_mb} MB)")
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
