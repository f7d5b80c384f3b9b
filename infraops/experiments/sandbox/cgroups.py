"""The control groups of one run (:class:`_Cgroups`): its own pids, memory and CPU-time
accounting below the worker's groups (or a delegated one), read while it runs, emptied and
removed after it; and, for the operator, how this host limits runs (:func:`sandbox_containment`).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from infraops.experiments.sandbox.config import _LEFTOVER_WAIT_SECONDS, SandboxLimits
from infraops.experiments.sandbox.scratch import scratch_available

log = logging.getLogger("infraops.experiments.sandbox")  # one logger for the package

# Each run gets control groups of its own, below the worker's own ones, in a folder of this
# name: <worker's cgroup>/infraops-sandbox/r<worker pid>-<n>-<random>. Processes of the run stay
# inside whatever contains the worker (its memory accounting, its own limits, its kill at stop).
CGROUP_FOLDER = "infraops-sandbox"
# Where cgroup v2 forbids that (the worker's own group holds processes, so it may not hand
# controllers to children: a container's or a service's group), the operator names a group that
# holds none, delegated to the worker (systemd's Delegate=, or a folder root made): the runs'
# groups are made below it instead, outside the worker's own accounting.
CGROUP_DELEGATED_ENV = "INFRAOPS_SANDBOX_CGROUP"
_CGROUP_CONTROLLERS: Final = ("pids", "memory", "cpuacct")
_CGROUP_ROOT = Path("/proc/self")  # where cgroup and mountinfo are read (tests point it away)
# The supervisor, bwrap and bwrap's init live in the run's pids group besides the command.
_OVERHEAD_PROCESSES: Final = 3
_CGROUP_REMOVE_SECONDS: Final = 5.0

_cgroup_lock = threading.Lock()
_cgroup_serial = 0
_cgroup_note: list[str] = []  # the last reason control groups could not be used (logged once)


@dataclass(frozen=True)
class _CgroupPlaces:
    """Where the worker's own control groups are: per cgroup-v1 controller its folder, and its
    cgroup-v2 folder with the controllers that are available there."""

    v1: dict[str, Path]
    v2: Path | None
    v2_controllers: frozenset[str]


def _cgroup_places() -> _CgroupPlaces:
    memberships: list[tuple[set[str], str]] = []
    v2_path: str | None = None
    for line in (_CGROUP_ROOT / "cgroup").read_text().splitlines():
        number, controllers, path = line.split(":", 2)
        if number == "0" and not controllers:
            v2_path = path
        else:
            memberships.append((set(controllers.split(",")), path))
    v1: dict[str, Path] = {}
    v2: Path | None = None
    for line in (_CGROUP_ROOT / "mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        root, mountpoint = _unescape(fields[3]), Path(_unescape(fields[4]))
        if tail[0] == "cgroup":
            options = set(tail[2].split(","))
            for controller in _CGROUP_CONTROLLERS:
                for names, path in memberships:
                    if controller in names and controller in options and controller not in v1:
                        inside = _below(root, path)
                        if inside is not None:
                            v1[controller] = mountpoint / inside
        elif tail[0] == "cgroup2" and v2_path is not None and v2 is None:
            inside = _below(root, v2_path)
            if inside is not None:
                v2 = mountpoint / inside
    available: frozenset[str] = frozenset()
    if v2 is not None:
        with contextlib.suppress(OSError):
            available = frozenset((v2 / "cgroup.controllers").read_text().split())
    return _CgroupPlaces(v1, v2, available - set(v1))


def _unescape(text: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        text = text.replace(code, char)
    return text


def _below(root: str, path: str) -> str | None:
    """path (a cgroup) relative to the mount's root, or None when the mount does not show it."""
    if root == "/":
        return path.lstrip("/")
    if path == root or path.startswith(root.rstrip("/") + "/"):
        return path[len(root):].lstrip("/")
    return None


class _Cgroups:
    """One run's control groups: made before it starts, read while it runs, emptied and removed
    after it. v1 has one folder per controller; v2 one folder for all."""

    def __init__(self, limits: SandboxLimits) -> None:
        self.limits = limits
        self.v1: dict[str, Path] = {}
        self.v2: Path | None = None
        self.v2_controllers: set[str] = set()
        self.notes: list[str] = []

    @property
    def controllers(self) -> set[str]:
        return set(self.v1) | self.v2_controllers

    @classmethod
    def make(cls, limits: SandboxLimits) -> _Cgroups:
        """The run's groups for every controller that can be used here; a controller that
        cannot leaves a note (see sandbox_containment) and the run goes on without it."""
        groups = cls(limits)
        if os.geteuid() != 0:
            groups.notes.append("the service does not run as root")
            return groups
        try:
            places = _cgroup_places()
        except (OSError, ValueError) as exc:
            groups.notes.append(f"cannot read this process's control groups: {exc}")
            return groups
        global _cgroup_serial
        with _cgroup_lock:
            _cgroup_serial += 1
            name = f"r{os.getpid()}-{_cgroup_serial}-{os.urandom(3).hex()}"
        for controller in _CGROUP_CONTROLLERS:
            if controller in places.v1:
                try:
                    groups.v1[controller] = _make_child(places.v1[controller], name)
                    groups._apply_v1(controller)
                except OSError as exc:
                    groups.notes.append(f"cgroup v1 {controller}: {exc}")
                    groups._remove_one(groups.v1.pop(controller, None))
        own, available = places.v2, places.v2_controllers
        delegated = os.environ.get(CGROUP_DELEGATED_ENV, "")
        if delegated and places.v2 is not None:
            own = Path(delegated)
            try:
                available = frozenset((own / "cgroup.controllers").read_text().split())
            except OSError as exc:
                groups.notes.append(f"{CGROUP_DELEGATED_ENV}={delegated}: {exc}")
                available = frozenset()
        wanted = {"pids", "memory"} & available - set(groups.v1)
        if own is not None and (wanted or "cpuacct" not in groups.v1):
            groups._make_v2(own, name, wanted)
        missing = {"pids", "memory"} - groups.controllers
        if missing:
            groups.notes.append(f"no usable {' or '.join(sorted(missing))} control group here")
        return groups

    def _make_v2(self, own: Path, name: str, wanted: set[str]) -> None:
        try:
            parent = own / CGROUP_FOLDER
            if wanted:
                enable = " ".join(f"+{c}" for c in sorted(wanted))
                (own / "cgroup.subtree_control").write_text(enable)
                parent.mkdir(exist_ok=True)
                (parent / "cgroup.subtree_control").write_text(enable)
            self.v2 = _make_child(own, name)
            self.v2_controllers = wanted | {"cpuacct"}  # cpu.stat is there without a controller
            if "pids" in wanted:
                (self.v2 / "pids.max").write_text(str(self._pids_max()))
            if "memory" in wanted:
                (self.v2 / "memory.max").write_text(str(self.limits.memory_mb << 20))
                with contextlib.suppress(FileNotFoundError):
                    (self.v2 / "memory.swap.max").write_text("0")
        except OSError as exc:
            # EBUSY: the worker's own group holds processes, so it may not hand controllers to
            # children (cgroup v2's rule): the operator delegates a subtree to the worker.
            hint = (f": set {CGROUP_DELEGATED_ENV} to a cgroup v2 folder that holds no process"
                    if exc.errno == errno.EBUSY else "")
            self.notes.append(f"cgroup v2 at {own}: {exc}{hint}")
            self._remove_one(self.v2)
            self.v2, self.v2_controllers = None, set()

    def _pids_max(self) -> int:
        return self.limits.processes + _OVERHEAD_PROCESSES

    def _apply_v1(self, controller: str) -> None:
        folder = self.v1[controller]
        if controller == "pids":
            (folder / "pids.max").write_text(str(self._pids_max()))
        elif controller == "memory":
            limit = str(self.limits.memory_mb << 20)
            (folder / "memory.limit_in_bytes").write_text(limit)
            with contextlib.suppress(FileNotFoundError):  # no swap accounting: nothing to cap
                (folder / "memory.memsw.limit_in_bytes").write_text(limit)

    def join_files(self) -> list[str]:
        files = [str(folder / "cgroup.procs") for folder in self.v1.values()]
        if self.v2 is not None:
            files.append(str(self.v2 / "cgroup.procs"))
        return files

    def _read(self, controller: str, v1_file: str, v2_file: str) -> str | None:
        try:
            if controller in self.v1:
                return (self.v1[controller] / v1_file).read_text()
            if self.v2 is not None and controller in self.v2_controllers:
                return (self.v2 / v2_file).read_text()
        except OSError:
            return None
        return None

    def processes_refused(self) -> int:
        """How many forks (and thread starts) the pids group refused."""
        return _field(self._read("pids", "pids.events", "pids.events"), "max")

    def oom_kills(self) -> int:
        """How many processes the kernel killed at the memory limit."""
        return _field(self._read("memory", "memory.oom_control", "memory.events"), "oom_kill")

    def memory_peak_mb(self) -> int | None:
        text = self._read("memory", "memory.max_usage_in_bytes", "memory.peak")
        return int(text) >> 20 if text and text.strip().isdigit() else None

    def cpu_seconds(self) -> float | None:
        if "cpuacct" in self.v1:
            text = self._read("cpuacct", "cpuacct.usage", "")
            return int(text) / 1e9 if text and text.strip().isdigit() else None
        text = self._read("cpuacct", "", "cpu.stat")
        return _field(text, "usage_usec") / 1e6 if text else None

    def members(self) -> list[int]:
        for folder in [*self.v1.values(), *([self.v2] if self.v2 is not None else [])]:
            try:
                return [int(v) for v in (folder / "cgroup.procs").read_text().split()]
            except OSError:
                continue
        return []

    def empty(self) -> None:
        """SIGKILL whatever is still in the groups (the pid namespace should have ended it)."""
        deadline = time.monotonic() + _LEFTOVER_WAIT_SECONDS
        while (members := self.members()) and time.monotonic() < deadline:
            log.error("sandbox processes %s outlived their run; killing them", members)
            if self.v2 is not None and (self.v2 / "cgroup.kill").exists():
                with contextlib.suppress(OSError):
                    (self.v2 / "cgroup.kill").write_text("1")
            for pid in members:
                self._kill_member(pid)
            time.sleep(0.05)

    def _kill_member(self, pid: int) -> None:
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            return
        try:  # still listed after the pidfd was taken: not a recycled pid of someone else
            if pid in self.members():
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        except ProcessLookupError:
            pass
        finally:
            os.close(pidfd)

    def remove(self) -> None:
        """Remove the groups; an exiting process can keep a group busy for a moment."""
        for folder in [*self.v1.values(), *([self.v2] if self.v2 is not None else [])]:
            self._remove_one(folder)
        self.v1, self.v2, self.v2_controllers = {}, None, set()

    @staticmethod
    def _remove_one(folder: Path | None) -> None:
        if folder is None:
            return
        deadline = time.monotonic() + _CGROUP_REMOVE_SECONDS
        while True:
            try:
                folder.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError as exc:
                if time.monotonic() >= deadline:
                    log.error("cannot remove the control group %s: %s", folder, exc)
                    return
                time.sleep(0.02)


def _make_child(own: Path, name: str) -> Path:
    parent = own / CGROUP_FOLDER
    parent.mkdir(exist_ok=True)
    _sweep(parent)
    child = parent / name
    child.mkdir()
    return child


def _sweep(parent: Path) -> None:
    """End the groups of runs whose worker process is gone (killed before it removed them)."""
    with contextlib.suppress(OSError):
        for entry in parent.iterdir():
            owner = entry.name[1:].split("-", 1)[0]
            if not (entry.name.startswith("r") and owner.isdigit()) or int(owner) == os.getpid():
                continue
            try:
                os.kill(int(owner), 0)
            except ProcessLookupError:
                _end_stale_group(entry)
            except PermissionError:
                pass


def _end_stale_group(folder: Path) -> None:
    """SIGKILL what a dead worker's run left in its group, then remove the group. The parent-
    death signals end a run with its worker, but not a bubblewrap child created a moment before
    it armed `--die-with-parent`: that one waits on its eventfd for ever, under init."""
    deadline = time.monotonic() + _CGROUP_REMOVE_SECONDS
    while time.monotonic() < deadline:
        try:
            members = [int(v) for v in (folder / "cgroup.procs").read_text().split()]
        except OSError:
            return  # removed meanwhile (by another worker's sweep)
        for pid in members:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        try:
            folder.rmdir()
            return
        except OSError:
            time.sleep(0.02)
    log.error("cannot end the control group %s of a dead worker's run", folder)


def _field(text: str | None, name: str) -> int:
    """The number after `name` in a flat-keyed cgroup file (pids.events, memory.events...)."""
    for line in (text or "").splitlines():
        key, _, value = line.partition(" ")
        if key == name and value.strip().isdigit():
            return int(value)
    return 0


def sandbox_containment() -> str:
    """One sentence: how processes, memory and disk of a run are limited on this host (made by
    starting nothing: it makes and removes an empty group)."""
    groups = _Cgroups.make(SandboxLimits())
    try:
        have = groups.controllers
    finally:
        groups.remove()
    parts = []
    parts.append("processes per sandbox (pids control group)" if "pids" in have else
                 "processes per uid (RLIMIT_NPROC), a uid per experiment from the pool")
    parts.append("memory per sandbox (memory control group)" if "memory" in have else
                 "memory per process only (RLIMIT_AS)")
    parts.append("disk bytes and files per sandbox (a sized tmpfs of its own)"
                 if scratch_available() else "disk bytes per sandbox (measured while it runs)")
    note = f" ({'; '.join(groups.notes)})" if groups.notes else ""
    return "Limits: " + ", ".join(parts) + note + "."


def _note_degraded(groups: _Cgroups) -> None:
    """Log once per distinct reason that runs go without a control group."""
    if not groups.notes:
        return
    note = "; ".join(groups.notes)
    with _cgroup_lock:
        if _cgroup_note == [note]:
            return
        _cgroup_note[:] = [note]
    shared = "pids" not in groups.controllers
    log.warning("sandbox control groups not fully usable (%s)%s", note,
                ": the process limit is per uid (a uid per experiment where the pool is set)"
                if shared else "")
