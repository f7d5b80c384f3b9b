"""Running one sandbox (:func:`sandbox_run`): start it, pump its output, watch its limits,
stop it at the first it crosses or at its deadline, and return only once nothing of it is left."""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Final

from infraops.experiments.sandbox.cgroups import CGROUP_DELEGATED_ENV, _Cgroups, _note_degraded
from infraops.experiments.sandbox.config import (
    REASON_CPU,
    REASON_DISK,
    REASON_MEMORY,
    REASON_PROCESSES,
    REASON_TIMEOUT,
    SandboxIdentity,
    SandboxResult,
    SandboxSpec,
    SandboxUnavailable,
)
from infraops.experiments.sandbox.disk import _DiskMeter, _megabytes
from infraops.experiments.sandbox.launch import _launch_argv, _start
from infraops.experiments.sandbox.mounts import _validate
from infraops.experiments.sandbox.outcome import _Capture, _classify, _Hit
from infraops.experiments.sandbox.pid_namespace import _Namespace
from infraops.experiments.sandbox.scratch import _Scratch, remove_throwaway, throwaway_workdir
from infraops.experiments.sandbox.uids import _run_identity

_CHUNK: Final = 65536
# After a timeout the pid namespace is killed first so that bwrap and the supervisor reap it;
# the process group is killed only if that has not ended the run within this grace.
_KILL_GRACE_SECONDS: Final = 2.0
# How often a running sandbox's control groups and disk use are read.
_LIMIT_CHECK_SECONDS: Final = 0.25


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
    scratch: _Scratch | None = None
    throwaway: Path | None = None
    try:
        scratch = _Scratch.make(spec)
        if scratch is None and not spec.keep_workdir:
            throwaway = throwaway_workdir(spec.workdir)
            spec = replace(spec, workdir=throwaway)
        run = _Run(spec, on_output, groups, None if scratch else _DiskMeter(spec), scratch)
        argv = _launch_argv(scratch.inside() if scratch else spec, chosen, status_write, groups)
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
            result = run.finish(process, started)
        if scratch is not None:
            scratch.keep()
        return result
    finally:
        if run is not None:
            run.close()
        if scratch is not None:
            scratch.remove()
        if throwaway is not None:
            remove_throwaway(throwaway)
        groups.empty()
        groups.remove()
        os.close(status_read)
        if status_write != -1:
            os.close(status_write)


class _Run:
    """Pumps one started sandbox's output until it ends or its deadline passes, watching its
    control groups and its disk use (its scratch's, or the meter's) meanwhile."""

    def __init__(self, spec: SandboxSpec, on_output: Callable[[str, bytes], None] | None,
                 groups: _Cgroups | None = None, disk: _DiskMeter | None = None,
                 scratch: _Scratch | None = None) -> None:
        self.spec = spec
        self.on_output = on_output
        self.stdout = _Capture("stdout", spec.limits.output_bytes)
        self.stderr = _Capture("stderr", spec.limits.output_bytes)
        self.status = _Status()
        self.namespace: _Namespace | None = None
        self.groups = groups
        self.disk = disk
        self.scratch = scratch
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
        watching = self.groups is not None or self.disk is not None or self.scratch is not None
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
        if self.scratch is not None:
            self._watch_scratch()
        if self.disk is not None:
            over = self.disk.check(now, self._members)
            if over is not None:
                verb = "wrote" if process is None else "stopped after writing"  # None: at the end
                self._hit(REASON_DISK, f"{verb} {_megabytes(over)} to its work tree and output, "
                                       f"over the {limits.disk_mb} MB disk limit")
                self._stop(process)

    def _watch_scratch(self) -> None:
        """The kernel refuses writes past the scratch's limits; a full scratch names them."""
        assert self.scratch is not None
        limits, used = self.spec.limits, self.scratch.usage()
        if used.bytes_full:
            self._hit(REASON_DISK, f"wrote {_megabytes(used.bytes)} to its work tree and output: "
                                   f"a write over the {limits.disk_mb} MB disk limit was refused")
        elif used.files_full:
            self._hit(REASON_DISK, f"made {used.files} files and folders in its work tree and "
                                   f"output: one more, over the {limits.inodes}-file limit, was "
                                   "refused")

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


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
