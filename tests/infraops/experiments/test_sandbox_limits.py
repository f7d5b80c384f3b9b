"""Per-sandbox limits (infraops.experiments.sandbox): one run cannot spend another's
processes, memory or disk; every limit hit is named in the order it happened; a cut output
says where; a failed sandbox check is retried. Every containment test starts real bubblewrap
sandboxes.

The fork bomb, the memory hog and the disk fill run inside sandboxes with small limits (32
processes, 256 MB, 64 MB): a CI run of the whole suite may share this machine.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from infraops.experiments import sandbox
from infraops.experiments.sandbox import (
    SandboxIdentity,
    SandboxLimits,
    SandboxMaxima,
    SandboxResult,
    SandboxSpec,
    cgroups,
    check,
    disk,
    launch,
    probe_limits,
    sandbox_check,
    sandbox_identity,
    sandbox_prepare_dir,
    sandbox_run,
    uids,
)
from tests.infraops.conftest import Dirs, make_dirs

PYTHON = "/usr/bin/python3"
IS_ROOT = os.geteuid() == 0
ROOT = Path(__file__).resolve().parents[3]
# Generous: a loaded 2-core machine may take seconds to start a sandbox. No test asserts a time.
DEADLINE = 120.0
# The fork bombs fill the process count of the sandbox uid that runs without a pool, which every
# such sandbox shares: under pytest-xdist they take turns in one worker process, or a bomb of
# one test leaves another's none to start bubblewrap with.
SHARED_UID = pytest.mark.xdist_group("shared-sandbox-uid")


def _controllers() -> set[str]:
    if shutil.which("bwrap") is None:
        return set()
    groups = cgroups._Cgroups.make(SandboxLimits())
    try:
        return groups.controllers
    finally:
        groups.remove()


CONTROLLERS = _controllers()
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not here")
needs_pids = pytest.mark.skipif(
    "pids" not in CONTROLLERS,
    reason="no usable pids control group (needs root and a writable cgroup pids controller): "
           "a fork bomb would spend the process limit every sandbox of the uid shares")
needs_memory = pytest.mark.skipif(
    "memory" not in CONTROLLERS,
    reason="no usable memory control group (needs root and a writable cgroup memory controller)")


def limits(**overrides: float) -> SandboxLimits:
    values: dict[str, float] = {
        "wall_seconds": DEADLINE, "cpu_seconds": 60, "address_space_mb": 1024,
        "file_size_mb": 64, "processes": 64, "output_bytes": 100_000, "memory_mb": 1024,
        "disk_mb": 1024,
    }
    values.update(overrides)
    return SandboxLimits(**values)  # type: ignore[arg-type]


def run(
    dirs: Dirs, command: str, lim: SandboxLimits | None = None, **kwargs: object,
) -> SandboxResult:
    spec = SandboxSpec(command=command, workdir=dirs.work, out_dir=dirs.out, env={},
                       limits=lim or limits())
    return sandbox_run(spec, **kwargs)  # type: ignore[arg-type]


def my_cgroups() -> list[Path]:
    """The control groups of runs of this process still there."""
    places = cgroups._cgroup_places()
    folders = [*places.v1.values(), *([places.v2] if places.v2 is not None else [])]
    return [entry for folder in folders
            for entry in (folder / sandbox.CGROUP_FOLDER).glob(f"r{os.getpid()}-*")]


# A fork bomb in a separate process, as another experiment in another pool process: it fills its
# process limit, prints FULL, keeps forking until the test writes `stop` into the folder beside
# its work tree bound read-only at /control (its work tree inside is a layer of its own, which
# the host's later writes do not reach: scratch.py), or its wall-clock limit, then exits 3.
# Prints the result as JSON on the last line.
BOMB_SERVICE = """
import json, sys
from pathlib import Path
from typing import Any
from infraops.experiments import sandbox
work, out, wall = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3])
result = sandbox.sandbox_run(sandbox.SandboxSpec(
    command="/usr/bin/python3 bomb.py", workdir=work, out_dir=out, env={},
    readonly_binds=[(work.parent / "control", "/control")],
    limits=sandbox.SandboxLimits(wall_seconds=wall, processes=32, output_bytes=10000)),
    on_output=lambda stream, chunk: (sys.stdout.write(chunk.decode()), sys.stdout.flush()))
print()
print(json.dumps({"reason": result.reason, "limits_hit": result.limits_hit,
                  "detail": result.detail}), flush=True)
"""

BOMB = r"""
import os, sys, time
said = False
while not os.path.exists("/control/stop"):
    try:
        if os.fork() == 0:
            while not os.path.exists("/control/stop"):
                time.sleep(0.05)
            os._exit(0)
    except OSError:
        if not said:
            print("FULL", flush=True)
            said = True
        time.sleep(0.01)
sys.exit(3)
"""

# The victim: 40 processes at once, each must start; exits 0 only if all did.
VICTIM = r"""
import os, sys
children = []
for _ in range(40):
    pid = os.fork()
    if pid == 0:
        import time; time.sleep(0.5); os._exit(0)
    children.append(pid)
print("STARTED", len(children), flush=True)
sys.exit(sum(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) != 0 for pid in children))
"""


@needs_pids
@SHARED_UID
def test_a_fork_bomb_in_one_run_does_not_fail_a_concurrent_run(dirs: Dirs) -> None:
    bomb = make_dirs("infraops-limits-test-")
    try:
        (bomb.work / "bomb.py").write_text(BOMB)
        (bomb.base / "control").mkdir(mode=0o755)
        (dirs.work / "victim.py").write_text(VICTIM)
        service = subprocess.Popen(
            [sys.executable, "-c", BOMB_SERVICE, str(bomb.work), str(bomb.out), str(DEADLINE)],
            cwd=ROOT, stdout=subprocess.PIPE, text=True)
        assert service.stdout is not None
        try:
            # With one shared RLIMIT_NPROC the bomb's 32 processes would leave the victim, whose
            # limit is 64, too few for its 40: here each sandbox counts its own.
            assert service.stdout.readline().strip() == "FULL"
            victim = run(dirs, f"{PYTHON} victim.py", limits(processes=64))
        finally:
            (bomb.base / "control" / "stop").write_text("")
            rest, _ = service.communicate(timeout=DEADLINE)
        assert (victim.reason, victim.exit_code) == ("ok", 0), victim.detail
        assert victim.stdout.split()[-1] == b"40"
        assert victim.limits_hit == ()
        bombed = json.loads(rest.strip().splitlines()[-1])
        assert bombed["reason"] == "process-limit", bombed
        assert "32-process limit of this sandbox" in bombed["detail"]
    finally:
        shutil.rmtree(bomb.base, ignore_errors=True)
    assert my_cgroups() == []


# The same fork bomb on a host without control groups, where RLIMIT_NPROC (counted per uid) is
# the only process limit: each side leases its identity from the pool given on the command line
# (infraops.experiments.sandbox.sandbox_identity_lease), as each experiment does.
POOLED_BOMB_SERVICE = """
import json, sys
from pathlib import Path
from infraops.experiments import sandbox
from infraops.experiments.sandbox import cgroups
cgroups._CGROUP_CONTROLLERS = ()  # a host with no usable control group
work, out, wall, uids = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
import contextlib
if uids.startswith("uid:"):  # one identity, shared with the victim: no lease
    uid = int(uids.removeprefix("uid:"))
    held = contextlib.nullcontext(sandbox.SandboxIdentity(uid=uid, gid=uid))
else:
    first, _, last = uids.partition("-")
    held = sandbox.sandbox_identity_lease(range(int(first), int(last) + 1))
with held as identity:
    for folder in (work, out):
        sandbox.sandbox_prepare_dir(folder, identity)
    print("UID", identity.uid, flush=True)
    result = sandbox.sandbox_run(sandbox.SandboxSpec(
        command="/usr/bin/python3 bomb.py", workdir=work, out_dir=out, env={},
        readonly_binds=[(work.parent / "control", "/control")],
        limits=sandbox.SandboxLimits(wall_seconds=wall, processes=32, output_bytes=10000)),
        identity=identity,
        on_output=lambda stream, chunk: (sys.stdout.write(chunk.decode()), sys.stdout.flush()))
print()
print(json.dumps({"reason": result.reason, "detail": result.detail}), flush=True)
"""

UID_POOL = range(1_900_001_000, 1_900_001_004)  # a range of its own: a CI run may lease too
# The control's one uid, shared by its bomb and its victim and by nothing else: the machine's
# sandbox user is shared by every sandbox the suite starts in its other processes, whose
# processes would count against the bomb's limit (its bubblewrap then could not start).
SHARED_CONTROL_UID = UID_POOL.stop + 2


def _uids(pool: range) -> str:
    return f"{pool.start}-{pool.stop - 1}" if pool else f"uid:{SHARED_CONTROL_UID}"


@pytest.mark.skipif(not IS_ROOT, reason="only root can run sandboxes as other uids")
@needs_bwrap
@pytest.mark.parametrize("pool", [UID_POOL, range(0)], ids=["uid-pool", "one-uid"])
@SHARED_UID
def test_without_control_groups_a_fork_bomb_fails_another_run_only_when_they_share_a_uid(
    pool: range, dirs: Dirs, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cgroups, "_CGROUP_CONTROLLERS", ())
    monkeypatch.setattr(uids, "_pids_groups_seen", False)
    bomb = make_dirs("infraops-limits-test-")
    try:
        (bomb.work / "bomb.py").write_text(BOMB)
        (bomb.base / "control").mkdir(mode=0o755)
        (dirs.work / "victim.py").write_text(VICTIM)
        argv = [str(bomb.work), str(bomb.out), str(DEADLINE), _uids(pool)]
        service = subprocess.Popen([sys.executable, "-c", POOLED_BOMB_SERVICE, *argv],
                                   cwd=ROOT, stdout=subprocess.PIPE, text=True)
        assert service.stdout is not None
        try:
            bomb_uid = int(service.stdout.readline().split()[1])
            assert service.stdout.readline().strip() == "FULL"
            shared = SandboxIdentity(uid=SHARED_CONTROL_UID, gid=SHARED_CONTROL_UID)
            held = sandbox.sandbox_identity_lease(pool) if pool else contextlib.nullcontext(shared)
            with held as identity:
                sandbox_prepare_dir(dirs.work, identity)
                sandbox_prepare_dir(dirs.out, identity)
                victim = run(dirs, f"{PYTHON} victim.py", limits(processes=64),
                             identity=identity)
        finally:
            (bomb.base / "control" / "stop").write_text("")
            rest, _ = service.communicate(timeout=DEADLINE)
        # (The bomb itself ends by exiting: without a pids group only its own output could
        # name the limit, and it prints none.)
        assert json.loads(rest.strip().splitlines()[-1])["reason"] in {"exit", "process-limit"}
        if pool:
            assert identity.uid in pool and bomb_uid in pool and identity.uid != bomb_uid
            assert (victim.reason, victim.exit_code) == ("ok", 0), victim.detail
            assert victim.stdout.split()[-1] == b"40"
        else:  # the control: one uid, one shared limit, the victim pays for the bomb
            assert identity.uid == bomb_uid == SHARED_CONTROL_UID
            assert victim.reason == "process-limit", victim.detail
    finally:
        shutil.rmtree(bomb.base, ignore_errors=True)


@pytest.mark.skipif(not IS_ROOT, reason="only root can start processes as other uids")
def test_a_leased_uid_runs_nothing_left_from_an_earlier_holder_and_a_full_pool_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cgroups, "_CGROUP_CONTROLLERS", ())
    monkeypatch.setattr(uids, "_pids_groups_seen", False)
    pool = range(UID_POOL.stop, UID_POOL.stop + 1)  # one uid
    left = subprocess.Popen(["sleep", "600"], user=pool.start, group=pool.start)
    try:
        with sandbox.sandbox_identity_lease(pool) as identity:
            assert identity == SandboxIdentity(pool.start, pool.start)
            assert left.wait(timeout=DEADLINE) == -9  # killed when the lease began
            with (pytest.raises(sandbox.SandboxUnavailable, match="Every sandbox uid of the"),
                  sandbox.sandbox_identity_lease(pool)):
                pass
        with sandbox.sandbox_identity_lease(pool) as again:  # released: free again
            assert again == identity
    finally:
        left.kill()
        left.wait()


def test_with_per_sandbox_control_groups_every_experiment_keeps_the_one_sandbox_uid(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(uids, "_pids_groups_seen", True)
    expected = sandbox_identity() if IS_ROOT else None
    with sandbox.sandbox_identity_lease(UID_POOL) as identity:
        if expected is not None:
            assert identity == expected
        assert identity.uid not in UID_POOL


@needs_pids
def test_a_run_that_hits_the_process_limit_then_times_out_names_both_in_order(
    dirs: Dirs,
) -> None:
    (dirs.work / "bomb.py").write_text(BOMB)
    result = run(dirs, f"{PYTHON} bomb.py", limits(processes=16, wall_seconds=8))
    assert result.limits_hit == ("process-limit", "timeout"), result.detail
    assert result.reason == "process-limit"
    assert result.exit_code is None
    process, timeout = result.detail.split("; then ")
    assert "16-process limit" in process
    assert "wall-clock timeout" in timeout
    assert my_cgroups() == []


HOG = (f"for i in 1 2 3 4 5 6 7 8; do {PYTHON} -c 'import time; b = b\"x\" * (64 << 20); "
       "time.sleep(3)' & done; wait")


@needs_memory
def test_many_processes_together_are_stopped_at_the_sandbox_memory_total(dirs: Dirs) -> None:
    # Eight processes of 64 MB: each far under the per-process address-space cap (1024 MB),
    # together twice the sandbox's 256 MB.
    result = run(dirs, HOG, limits(memory_mb=256))
    assert result.reason == "memory-limit", result.detail
    assert "256 MB memory limit of this sandbox" in result.detail
    assert result.limits_hit[0] == "memory-limit"
    assert my_cgroups() == []


@needs_bwrap
def test_many_files_each_under_the_file_size_cap_are_stopped_at_the_disk_limit(
    dirs: Dirs,
) -> None:
    fill = "for i in $(seq 1 40); do head -c 8000000 /dev/zero > fill-$i || exit 9; done; sleep 30"
    result = run(dirs, fill, limits(file_size_mb=16, disk_mb=64))
    assert result.reason == "disk-limit", result.detail
    assert "over the 64 MB disk limit" in result.detail
    if IS_ROOT:  # the kernel refused the write (scratch.py): the shell stopped there, at once
        assert result.exit_code == 9, result.detail
        kept = sum(path.stat().st_size for path in dirs.work.glob("fill-*"))
        assert 0 < kept <= 64 << 20
    else:  # the meter stopped it: the sleep never ended
        assert result.exit_code is None
    assert my_cgroups() == []


@needs_bwrap
def test_a_deleted_file_still_held_open_counts_toward_the_disk_limit(dirs: Dirs) -> None:
    code = ("import os, time\nf = open(\"hidden\", \"wb\")\nos.unlink(\"hidden\")\n"
            "for _ in range(12):\n    f.write(b\"x\" * (8 << 20)); f.flush()\ntime.sleep(30)\n")
    (dirs.work / "hide.py").write_text(code)
    result = run(dirs, f"{PYTHON} hide.py", limits(file_size_mb=128, disk_mb=32))
    assert result.reason == "disk-limit", result.detail
    assert not list(dirs.work.glob("hidden*"))


@needs_bwrap
def test_a_run_that_wrote_past_the_disk_limit_before_a_check_still_fails_named(
    dirs: Dirs, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(disk, "_DISK_CHECK_SECONDS", 3600.0)  # only the final check
    result = run(dirs, "head -c 40000000 /dev/zero > a; head -c 40000000 /dev/zero > b",
                 limits(file_size_mb=64, disk_mb=32))
    assert result.reason == "disk-limit", result.detail
    assert result.detail.startswith("wrote ")


# Writes what it can (empty folders first, then big files into one more), counting the bytes
# the kernel took, and prints that count whatever stopped it.
MANY_THEN_BIG = r"""
import os, sys
folders, files, size = (int(arg) for arg in sys.argv[1:])
wrote, chunk = 0, b"x" * (1 << 20)
try:
    for i in range(folders):
        os.mkdir("empty-%d" % i)
    os.mkdir("big")
    for i in range(files):
        with open("big/%d" % i, "wb") as f:
            for _ in range(size):
                wrote += f.write(chunk)
except OSError as exc:
    print("REFUSED", exc, file=sys.stderr)
print("WROTE", wrote, flush=True)
"""


def wrote(result: SandboxResult) -> int:
    return int(result.stdout.split()[-1])


needs_scratch = pytest.mark.skipif(
    not IS_ROOT or shutil.which("bwrap") is None,
    reason="the kernel holds the disk limit only where the worker can mount a scratch (root)")


@needs_scratch
def test_entries_past_a_meters_cap_do_not_hide_bytes_from_the_disk_limit(
    dirs: Dirs, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Issue 28's attack, made small: more entries than a walking meter counts (its cap lowered
    # from 500,000 to 1,000 here), then files five times the limit behind them.
    monkeypatch.setattr(disk, "_DISK_MAX_ENTRIES", 1_000)
    (dirs.work / "attack.py").write_text(MANY_THEN_BIG)
    result = run(dirs, f"{PYTHON} attack.py 1100 5 16", limits(disk_mb=32))
    assert result.reason == "disk-limit", result.detail
    assert "over the 32 MB disk limit was refused" in result.detail
    assert 0 < wrote(result) <= 32 << 20
    kept = sum(path.stat().st_size for path in (dirs.work / "big").iterdir())
    assert kept == wrote(result)  # what the run wrote reached the host's work tree, no more


@needs_scratch
def test_the_file_count_has_a_limit_of_its_own(dirs: Dirs) -> None:
    (dirs.work / "attack.py").write_text(MANY_THEN_BIG)
    result = run(dirs, f"{PYTHON} attack.py 5000 0 0", limits(inodes=1000))
    assert result.reason == "disk-limit", result.detail
    assert "over the 1000-file limit, was refused" in result.detail
    assert b"No space left on device" in result.stderr
    assert 990 <= len(list(dirs.work.glob("empty-*"))) <= 1000


@needs_scratch
def test_what_a_run_changes_in_its_work_tree_reaches_the_host_and_the_next_run(
    dirs: Dirs,
) -> None:
    (dirs.work / "kept.txt").write_text("old")
    (dirs.work / "gone.txt").write_text("bye")
    (dirs.work / "folder").mkdir()
    (dirs.work / "folder" / "old.txt").write_text("old")
    (dirs.work / "becomes-file").mkdir()
    sandbox_prepare_dir(dirs.work, dirs.identity)
    changes = ("echo new > kept.txt; rm gone.txt; rm -r folder; mkdir -p folder/sub; "
               "echo fresh > folder/sub/new.txt; rmdir becomes-file; echo f > becomes-file; "
               "ln -s kept.txt link; mkdir -p deep/a/b; echo d > deep/a/b/c; "
               "echo result > /out/result.txt")
    result = run(dirs, changes)
    assert result.reason == "ok", result.detail
    work = dirs.work
    assert (work / "kept.txt").read_text() == "new\n"
    assert not (work / "gone.txt").exists()
    assert sorted(p.relative_to(work).as_posix() for p in (work / "folder").rglob("*")) == [
        "folder/sub", "folder/sub/new.txt"]  # the old folder's file did not come back
    assert (work / "becomes-file").read_text() == "f\n"
    assert (work / "link").is_symlink() and os.readlink(work / "link") == "kept.txt"
    assert (work / "deep/a/b/c").read_text() == "d\n"
    assert (dirs.out / "result.txt").read_text() == "result\n"
    if IS_ROOT:
        assert (work / "folder/sub/new.txt").stat().st_uid == dirs.identity.uid
    again = run(dirs, "cat kept.txt folder/sub/new.txt; test ! -e gone.txt")
    assert (again.reason, again.stdout) == ("ok", b"new\nfresh\n"), again.detail
    mounts = Path("/proc/self/mountinfo").read_text()
    # Every scratch of this process unmounted (another test process may hold its own now).
    assert f"infraops-sandbox/scratch/r{os.getpid()}-" not in mounts


@needs_bwrap
@pytest.mark.parametrize("scratch_mounts", [True, False], ids=["scratch", "throwaway-copy"])
def test_a_run_that_keeps_no_work_tree_leaves_it_as_it_found_it_and_keeps_its_output(
    dirs: Dirs, monkeypatch: pytest.MonkeyPatch, scratch_mounts: bool,
) -> None:
    from infraops.experiments.sandbox import scratch

    if scratch_mounts and not scratch.scratch_available():
        pytest.skip("no scratch here: needs root and tmpfs and overlay mounts")
    if not scratch_mounts:
        monkeypatch.setattr(scratch, "scratch_available", lambda: False)
    (dirs.work / "cache").mkdir()
    (dirs.work / "cache" / "kernel.bin").write_text("compiled")
    sandbox_prepare_dir(dirs.work, dirs.identity)
    # A kept run first (a compile cache's fill) that takes its own bits away from what it left.
    kept = run(dirs, "echo s > cache/secret; chmod 000 cache/secret; mkdir -p locked/in; "
                     "chmod 500 locked")
    assert kept.reason == "ok", kept.detail
    before = sorted(p.relative_to(dirs.work).as_posix() for p in dirs.work.rglob("*"))
    spec = SandboxSpec(
        command=("cat cache/kernel.bin; echo memo > cache/memo; echo x >> cache/kernel.bin; "
                 "rm -r cache/kernel.bin; mkdir -p mine/deep; chmod 500 mine; "
                 "echo kept > /out/result.txt"),
        workdir=dirs.work, out_dir=dirs.out, env={}, limits=limits(), keep_workdir=False)
    result = sandbox_run(spec, identity=dirs.identity)
    assert (result.reason, result.stdout) == ("ok", b"compiled"), result.detail
    assert sorted(p.relative_to(dirs.work).as_posix() for p in dirs.work.rglob("*")) == before
    assert (dirs.work / "cache" / "kernel.bin").read_text() == "compiled"
    assert (dirs.out / "result.txt").read_text() == "kept\n"
    assert not [p for p in dirs.work.parent.iterdir() if ".run-" in p.name]  # copy removed


@needs_scratch
def test_a_scratch_left_by_a_killed_worker_is_unmounted_by_the_next_run(dirs: Dirs) -> None:
    from infraops.experiments.sandbox import scratch

    parent = scratch._scratch_parent()
    orphan = parent / "r999999999-0"  # no such process: pids stop far below this
    orphan.mkdir()
    scratch._mount("tmpfs", orphan, "tmpfs", "size=1048576")
    result = run(dirs, "true")
    assert result.reason == "ok", result.detail
    assert not orphan.exists()
    assert str(orphan) not in Path("/proc/self/mountinfo").read_text()


@needs_scratch
def test_where_a_scratch_cannot_be_mounted_the_disk_limit_is_measured_and_said(
    dirs: Dirs, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    from infraops.experiments.sandbox import scratch

    def refused(*args: object, **kwargs: object) -> None:
        raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(scratch, "_mount", refused)
    monkeypatch.setattr(scratch, "_refused", [])
    result = run(dirs, "head -c 40000000 /dev/zero > a; sleep 30",
                 limits(file_size_mb=64, disk_mb=32))
    assert result.reason == "disk-limit", result.detail
    assert result.detail.startswith("stopped after writing")  # the meter, not the kernel
    assert "cannot be mounted here (Operation not permitted)" in caplog.text
    assert "disk bytes per sandbox (measured while it runs)" in sandbox.sandbox_containment()
    assert not list(scratch._scratch_parent().glob(f"r{os.getpid()}-*"))


@needs_bwrap
def test_cut_output_says_where_it_was_cut(dirs: Dirs) -> None:
    result = run(dirs, "head -c 3200000 /dev/zero", limits(output_bytes=1_000_000))
    assert result.reason == "ok"
    assert result.output_truncated
    assert (len(result.stdout), result.stdout_bytes) == (1_000_000, 3_200_000)
    assert "stdout cut at 1 MB of 3.2 MB" in result.detail


@needs_bwrap
def test_limits_are_cleaned_up_after_every_kind_of_end(dirs: Dirs) -> None:
    for command, lim in (
        ("true", limits()),
        ("exit 4", limits()),
        (f"sleep 300 & {PYTHON} -c 'import time; time.sleep(300)'", limits(wall_seconds=2)),
    ):
        run(dirs, command, lim)
        assert my_cgroups() == []
    with pytest.raises(RuntimeError):
        run(dirs, "echo started; sleep 300", limits(), on_output=_raise_on_output)
    assert my_cgroups() == []


def _raise_on_output(stream: str, chunk: bytes) -> None:
    raise RuntimeError("the caller gave up")


@needs_bwrap
def test_the_controllers_found_here_are_used(dirs: Dirs) -> None:
    result = run(dirs, "cat /proc/self/cgroup", limits())
    assert result.reason == "ok"
    text = sandbox.sandbox_containment()
    if "pids" in CONTROLLERS:
        assert "processes per sandbox" in text
    else:
        assert "shared by every sandbox" in text


# --------------------------------------------------------------------------- the check


def test_a_failed_check_is_retried_before_the_process_gives_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    answers = ["A trivial sandboxed command failed: Resource temporarily unavailable.",
               "A trivial sandboxed command failed: Resource temporarily unavailable.", None]
    tries: list[int] = []

    def flaky() -> str | None:
        tries.append(1)
        return answers[len(tries) - 1]

    monkeypatch.setattr(launch, "BWRAP", "flaky-bwrap")
    monkeypatch.setattr(check, "_try_trivial_sandbox", flaky)
    monkeypatch.setattr(check, "_check_cache", {})
    monkeypatch.setattr(check, "_check_failures", {})
    monkeypatch.setattr(check, "CHECK_RETRY_DELAYS", (0.0, 0.0, 0.0, 0.0))
    assert sandbox_check() is None
    assert len(tries) == 3
    assert sandbox_check() is None  # a pass is kept
    assert len(tries) == 3


def test_a_check_that_keeps_failing_stands_for_a_while_then_is_tried_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tries: list[int] = []

    def broken() -> str | None:
        tries.append(1)
        return "A trivial sandboxed command failed: Resource temporarily unavailable."

    monkeypatch.setattr(launch, "BWRAP", "broken-bwrap")
    monkeypatch.setattr(check, "_try_trivial_sandbox", broken)
    monkeypatch.setattr(check, "_check_cache", {})
    monkeypatch.setattr(check, "_check_failures", {})
    monkeypatch.setattr(check, "CHECK_RETRY_DELAYS", (0.0, 0.0))
    assert "temporarily unavailable" in (sandbox_check() or "")
    assert len(tries) == 3
    assert sandbox_check() is not None
    assert len(tries) == 3  # stands: no new tries
    monkeypatch.setattr(check, "CHECK_FAILURE_SECONDS", 0.0)
    assert sandbox_check() is not None
    assert len(tries) == 6  # tried again, with its retries


def test_a_missing_bwrap_is_not_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launch, "BWRAP", "/nonexistent/bwrap-for-limits-test")
    monkeypatch.setattr(check, "_check_cache", {})
    monkeypatch.setattr(check, "_check_failures", {})
    slept: list[float] = []
    monkeypatch.setattr(check.time, "sleep", slept.append)
    assert "not installed" in (sandbox_check() or "")
    assert slept == []


def test_no_test_or_bench_patches_a_setting_where_the_code_does_not_read_it() -> None:
    """The package re-exports these settings, but launch and check read their own: a patch of
    the re-export would pass silently and change nothing."""
    names = "BWRAP|SUPERVISOR_BINARY|CHECK_RETRY_DELAYS|CHECK_FAILURE_SECONDS"
    stale = re.compile(rf'setattr\(\s*sandbox\s*,\s*"({names})"'
                       rf"|\bsandbox\.({names})\s*=(?!=)|experiments\.sandbox\.({names})\b")
    found = [f"{path.relative_to(ROOT)}:{number}"
             for folder in ("tests", "bench") for path in sorted((ROOT / folder).rglob("*.py"))
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if stale.search(line)]
    assert found == []


# --------------------------------------------------------------------------- per-probe limits


def test_a_probe_asks_for_limits_within_the_operators_maxima() -> None:
    maxima = SandboxMaxima(processes=100, memory_mb=2048, disk_mb=512)
    chosen = probe_limits(wall_seconds=30, maxima=maxima, processes=50, memory_mb=None,
                          disk_mb=512)
    assert (chosen.wall_seconds, chosen.processes, chosen.memory_mb, chosen.disk_mb) == (
        30, 50, 2048, 512)  # memory: the default 4096 lowered to the maximum
    with pytest.raises(ValueError, match="memory_mb = 4096 is over this host's maximum of 2048"):
        probe_limits(wall_seconds=30, maxima=maxima, memory_mb=4096)
    with pytest.raises(ValueError, match="processes = 0 must be a positive whole number"):
        probe_limits(wall_seconds=30, maxima=maxima, processes=0)


def test_limits_of_concurrent_runs_in_threads_are_separate(dirs: Dirs) -> None:
    # Two runs of one process at once each get (and remove) their own groups.
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not here")
    results: list[SandboxResult] = []
    other = make_dirs("infraops-limits-test-")
    try:
        thread = threading.Thread(target=lambda: results.append(
            run(other, "cat /proc/self/cgroup", limits())))
        thread.start()
        results.append(run(dirs, "cat /proc/self/cgroup", limits()))
        thread.join(DEADLINE)
    finally:
        shutil.rmtree(other.base, ignore_errors=True)
    assert [r.reason for r in results] == ["ok", "ok"]
    if CONTROLLERS & {"pids", "memory"}:
        assert my_cgroups() == []


def test_a_probes_sandbox_limits_come_from_its_manifest_keys_within_the_maxima(
        settings: Any) -> None:
    from infraops.errors import DomainError
    from infraops.experiments.services import probe_sandbox_limits
    from infraops.manifest import parse_manifest

    manifest = parse_manifest('[[probe]]\nname = "p"\nlayer = "correctness"\n'
                              'command = "true"\nprocesses = 32\nmemory_mb = 512\n'
                              'disk_mb = 64\n')
    [probe] = manifest.probes
    limits = probe_sandbox_limits(probe)
    assert (limits.processes, limits.memory_mb, limits.disk_mb) == (32, 512, 64)

    settings.SANDBOX_MAX_MEMORY_MB = 256
    with pytest.raises(DomainError, match="memory_mb = 512 is over this host's maximum of 256"):
        probe_sandbox_limits(probe)


def test_every_probe_gets_the_hosts_inode_limit(settings: Any) -> None:
    from infraops.experiments.services import probe_sandbox_limits
    from infraops.manifest import parse_manifest

    [probe] = parse_manifest('[[probe]]\nname = "p"\nlayer = "correctness"\n'
                             'command = "true"\n').probes
    assert probe_sandbox_limits(probe).inodes == 100_000
    settings.SANDBOX_MAX_INODES = 5_000
    assert probe_sandbox_limits(probe).inodes == 5_000


@pytest.mark.parametrize("line", ["processes = 0", "memory_mb = -1", "disk_mb = true",
                                  'disk_mb = "10"'])
def test_a_bad_sandbox_limit_in_the_manifest_is_a_named_error(line: str) -> None:
    from infraops.manifest import ManifestError, parse_manifest

    with pytest.raises(ManifestError, match=line.split(" ")[0]):
        parse_manifest(f'[[probe]]\nname = "p"\nlayer = "correctness"\ncommand = "true"\n{line}\n')


@pytest.mark.skipif(not IS_ROOT, reason="control groups are only made as root")
def test_on_cgroup_v2_a_run_gets_one_group_with_its_process_and_memory_limits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The v2 path on a fake cgroup2 mount (this machine class mounts v1): what is written
    where, and what is read back. The kernel's side (enforcement) is not simulated."""
    proc, mount = tmp_path / "proc", tmp_path / "cgroup2"
    own = mount / "system.slice" / "worker.service"
    proc.mkdir()
    own.mkdir(parents=True)
    (proc / "cgroup").write_text("0::/system.slice/worker.service\n")
    (proc / "mountinfo").write_text(
        f"30 25 0:26 / {mount} rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw\n")
    (own / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (own / "cgroup.subtree_control").write_text("")
    monkeypatch.setattr(cgroups, "_CGROUP_ROOT", proc)

    groups = cgroups._Cgroups.make(limits(processes=40, memory_mb=300))

    assert groups.v1 == {}
    assert groups.v2 is not None and groups.v2.parent == own / sandbox.CGROUP_FOLDER
    assert groups.controllers == {"pids", "memory", "cpuacct"}
    assert groups.notes == []
    for folder in (own, own / sandbox.CGROUP_FOLDER):  # handed down to the run's group
        assert (folder / "cgroup.subtree_control").read_text() == "+memory +pids"
    assert (groups.v2 / "pids.max").read_text() == str(40 + cgroups._OVERHEAD_PROCESSES)
    assert (groups.v2 / "memory.max").read_text() == str(300 << 20)
    assert (groups.v2 / "memory.swap.max").read_text() == "0"
    assert groups.join_files() == [str(groups.v2 / "cgroup.procs")]
    (groups.v2 / "pids.events").write_text("max 7\n")
    (groups.v2 / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 2\n")
    (groups.v2 / "memory.peak").write_text(str(280 << 20))
    (groups.v2 / "cpu.stat").write_text("usage_usec 1500000\nuser_usec 1000000\n")
    assert groups.processes_refused() == 7
    assert groups.oom_kills() == 2
    assert groups.memory_peak_mb() == 280
    assert groups.cpu_seconds() == 1.5
    for entry in groups.v2.iterdir():  # a real rmdir drops the interface files itself
        entry.unlink()
    run_folder = groups.v2
    groups.remove()
    assert not run_folder.exists()


@pytest.mark.skipif(not IS_ROOT, reason="control groups are only made as root")
def test_on_cgroup_v2_without_delegation_the_run_goes_on_without_groups_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    proc, mount = tmp_path / "proc", tmp_path / "cgroup2"
    own = mount / "worker"
    proc.mkdir()
    own.mkdir(parents=True)
    (proc / "cgroup").write_text("0::/worker\n")
    (proc / "mountinfo").write_text(f"30 25 0:26 / {mount} rw - cgroup2 cgroup2 rw\n")
    (own / "cgroup.controllers").write_text("memory pids\n")
    (own / "cgroup.subtree_control").mkdir()  # writing it fails, as EBUSY would
    monkeypatch.setattr(cgroups, "_CGROUP_ROOT", proc)

    groups = cgroups._Cgroups.make(limits())

    assert groups.v2 is None and groups.controllers == set()
    assert any(note.startswith(f"cgroup v2 at {own}:") for note in groups.notes), groups.notes
    assert "no usable memory or pids control group here" in groups.notes


@pytest.mark.skipif(not IS_ROOT, reason="control groups are only made as root")
def test_on_cgroup_v2_a_delegated_group_holds_the_runs_when_the_workers_own_cannot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A container's or a service's own group holds processes (EBUSY for its subtree_control):
    the runs' groups go below the group INFRAOPS_SANDBOX_CGROUP names, as on the lent H200."""
    proc, mount = tmp_path / "proc", tmp_path / "cgroup2"
    own, delegated = mount / "process_api" / "vm", mount / "infraops"
    proc.mkdir()
    own.mkdir(parents=True)
    delegated.mkdir()
    (proc / "cgroup").write_text("0::/process_api/vm\n")
    (proc / "mountinfo").write_text(f"30 25 0:26 / {mount} rw - cgroup2 cgroup2 rw\n")
    (own / "cgroup.controllers").write_text("memory pids\n")
    (own / "cgroup.subtree_control").mkdir()  # writing it fails, as EBUSY would
    (delegated / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (delegated / "cgroup.subtree_control").write_text("")
    monkeypatch.setattr(cgroups, "_CGROUP_ROOT", proc)
    monkeypatch.setenv(sandbox.CGROUP_DELEGATED_ENV, str(delegated))

    groups = cgroups._Cgroups.make(limits(memory_mb=300))

    assert groups.notes == [] and groups.controllers == {"pids", "memory", "cpuacct"}
    assert groups.v2 is not None and groups.v2.parent == delegated / sandbox.CGROUP_FOLDER
    assert (groups.v2 / "memory.max").read_text() == str(300 << 20)
    # A delegated group that is not there is said, and the run goes on without groups.
    monkeypatch.setenv(sandbox.CGROUP_DELEGATED_ENV, str(mount / "missing"))
    groups = cgroups._Cgroups.make(limits())
    assert groups.v2_controllers <= {"cpuacct"} and "memory" not in groups.controllers
    assert any(note.startswith(f"{sandbox.CGROUP_DELEGATED_ENV}={mount / 'missing'}:")
               for note in groups.notes), groups.notes
