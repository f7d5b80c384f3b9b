"""Reliability of experiments through real Celery workers (docs/product.md, "Reliability"):
SIGKILLed pool children and whole workers lose nothing and record nothing twice, a
poison experiment stops after max_attempts, a redelivery past the broker's visibility timeout
runs nothing twice, and hardware queues route probes to the workers that have the hardware.
An experiment past the soft time limit fails at once with the reason, and a killed attempt's
checkouts are removed by the next attempt.

Workers are subprocesses on the test database and on Redis database 11 (flushed around each
test), so messages left by other tests or other Redis users cannot reach them. Every worker is
killed, with its whole process tree, when its test ends.
"""

from __future__ import annotations

import re
import signal
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
import redis
from django.db import transaction
from django.db.models import Count
from django.utils import timezone

from infraops import gitops, tasks
from infraops.experiments import services as experiment_service
from infraops.experiments.accelerators import host_has_gpu
from infraops.experiments.services import experiment_request, experiments_reap
from infraops.experiments.workers import missing_worker_message
from infraops.models import Experiment, ProbeExecution, Sample, Target
from infraops.project.celery import app as celery_app
from infraops.services.targets import target_register
from tests.conftest import make_origin
from tests.infraops.workers_harness import (
    TimedOut,
    Worker,
    Workers,
    alive,
    described,
    holder_pid,
    running_in,
    started_workers,
    wait_until,
)
from tests.xdist_workers import spare_redis_url

pytestmark = pytest.mark.e2e

REDIS_DB_URL = spare_redis_url(1)  # this process's own: the tests empty it
OPEN = (Experiment.Status.QUEUED, Experiment.Status.RUNNING)
QUICK_PROBE = """import json, os, sys, time
time.sleep(float(sys.argv[1]))
with open(os.environ["INFRAOPS_OUT"] + "/metrics.jsonl", "w") as out:
    out.write(json.dumps({"name": "latency_ms", "value": 1.0}) + "\\n")
"""
PROBE_TABLE = """
[[probe]]
name = "{name}"
layer = "performance"
command = "python3 bench/quick.py {seconds}"
cost = {cost}
timeout = 30
covers = ["config/**"]
repeat = 1
warmup = 0  # these tests count executions per attempt: one a side
metrics = ["latency_ms"]
files = ["bench/quick.py"]
requires = [{requires}]
"""


@dataclass(frozen=True)
class Kill:
    experiment: int
    attempt: int
    pid: int
    descendants: set[psutil.Process]
    executions_before: int  # rows the killed attempt had recorded when it was killed


def figure(name: str, value: object, unit: str) -> None:
    print(f"figure: {name} {value} {unit}", flush=True)


# --------------------------------------------------------------------------- fixtures


@pytest.fixture
def broker(settings: Any) -> Iterator[str]:
    """Point this process's settings and Celery app at Redis db 11, empty before and after.

    The app read CELERY_BROKER_URL when it was first configured, so the setting alone would
    not move it: its broker URL and cached connection pools are swapped and restored."""
    client = redis.Redis.from_url(REDIS_DB_URL)
    client.flushdb()
    old_url = celery_app.conf.broker_url  # first: the app may read it from the settings
    settings.REDIS_URL = REDIS_DB_URL
    settings.CELERY_BROKER_URL = REDIS_DB_URL
    _reset_pools()
    celery_app.conf.update(broker_url=REDIS_DB_URL)
    try:
        yield REDIS_DB_URL
    finally:
        _reset_pools()
        celery_app.conf.update(broker_url=old_url)
        client.flushdb()


def _reset_pools() -> None:
    # Dropped, not closed: kombu keeps them in process-wide pools keyed by broker URL. The
    # remote-control mailbox keeps the producer pool it first used: it is made again too, or
    # a later test's `inspect` would broadcast to this test's Redis database.
    celery_app._pool = None
    celery_app.amqp._producer_pool = None
    celery_app.__dict__.pop("control", None)


@pytest.fixture
def workers(
    transactional_db: None, data_dir: Path, tmp_path: Path, broker: str
) -> Iterator[Workers]:
    """Starts workers on demand; kills every one of them (whole tree) at teardown, before
    the test database is flushed."""
    with started_workers(data_dir, tmp_path, broker) as started:
        yield started


@pytest.fixture
def quick_target(transactional_db: None, example_source: Path, tmp_path: Path
                 ) -> Callable[..., Target]:
    """A copy of tiny-serving whose probe sleeps `seconds` per side and writes one sample;
    `gpu=True` adds a second probe that requires a gpu."""

    def make(seconds: float = 0.5, *, gpu: bool = False) -> Target:
        (example_source / "bench" / "quick.py").write_text(QUICK_PROBE)
        manifest = PROBE_TABLE.format(name="latency-bench", seconds=seconds, cost=1, requires="")
        if gpu:
            manifest += PROBE_TABLE.format(name="gpu-bench", seconds=seconds, cost=2,
                                           requires='"gpu"')
        (example_source / "infraops.toml").write_text(manifest)
        name = f"quick-{uuid.uuid4().hex[:6]}"
        target = target_register(name=name, repo_url=str(make_origin(tmp_path, example_source,
                                                                     f"{name}.git")),
                                 base_branch="main")
        assert target.manifest() is not None, target.manifest_errors
        return target

    return make


def candidate_commit(target: Target, data_dir: Path, batch_size: int = 8) -> str:
    """A commit on the target's base that changes config/serving.toml."""
    tree = data_dir / f"candidate-{uuid.uuid4().hex[:8]}"
    gitops.worktree_add(target.clone_path, tree, target.manifest_commit)
    config = tree / "config" / "serving.toml"
    config.write_text(re.sub(r"(?m)^batch_size = \d+$", f"batch_size = {batch_size}",
                             config.read_text()))
    sha = gitops.commit_all(tree, f"batch_size {batch_size}", author_name="Test",
                            author_email="test@example.com")
    gitops.worktree_remove(target.clone_path, tree)
    assert sha is not None
    return sha


def request(target: Target, candidate: str, probes: tuple[str, ...] = ()) -> Experiment:
    """experiment_request in a committed transaction, so its task reaches the broker."""
    with transaction.atomic():
        experiment = experiment_request(target=target, candidate_commit=candidate,
                                        baseline_commit=target.manifest_commit, probes=probes,
                                        origin="reliability test")
    return experiment


# --------------------------------------------------------------------------- helpers


def kill_while_running(
    worker: Worker, ids: list[int], *, kill_key: Callable[[int, int], object], timeout: float,
) -> dict[object, Kill]:
    """Until every experiment in `ids` is finished: whenever one is RUNNING and
    kill_key(pk, attempt) is a key not killed before (None: not now), SIGKILL the pool child
    holding it. Returns {key: what was killed}."""
    kills: dict[object, Kill] = {}
    deadline = time.monotonic() + timeout
    while True:
        rows = list(Experiment.objects.filter(pk__in=ids, status__in=OPEN)
                    .values_list("pk", "status", "claimed_by", "attempts"))
        if not rows:
            return kills
        for pk, status, claimed_by, attempt in rows:
            if status != Experiment.Status.RUNNING:
                continue
            key = kill_key(pk, attempt)
            pid = holder_pid(claimed_by)
            if key is None or key in kills or pid is None:
                continue
            recorded = ProbeExecution.objects.filter(experiment_id=pk, attempt=attempt).count()
            descendants = worker.kill_pool_child(pid)
            if descendants is not None:
                kills[key] = Kill(pk, attempt, pid, descendants, recorded)
        if time.monotonic() > deadline:
            raise TimedOut(f"unfinished after {timeout:.0f} s (pk, status, holder, "
                                 f"attempts): {rows}; kills so far: {kills}")
        time.sleep(0.02)


def has_results(pk: int, attempt: int) -> bool:
    return ProbeExecution.objects.filter(experiment_id=pk, attempt=attempt).exists()


def duplicate_executions(ids: list[int]) -> int:
    """Rows sharing (experiment, attempt, probe, side, variant, repeat): must be 0."""
    return (ProbeExecution.objects.filter(experiment_id__in=ids)
            .order_by()
            .values("experiment", "attempt", "probe", "side", "variant", "repeat_index")
            .annotate(n=Count("id")).filter(n__gt=1).count())


def recorded_once(experiment: Experiment, *, sides: int = 2) -> bool:
    """The final attempt holds one full set of executions (all ok) and one sample per
    execution; no other attempt holds a full set; the summary is the final attempt's."""
    final = experiment.attempts
    executions = list(experiment.executions.filter(attempt=final))
    samples = Sample.objects.filter(experiment=experiment, execution__attempt=final).count()
    full_sets = (experiment.executions.order_by().values("attempt").annotate(n=Count("id"))
                 .filter(n=sides).count())
    return (len(executions) == sides and all(e.reason == "ok" for e in executions)
            and samples == sides and full_sets == 1
            and experiment.summary.get("attempt") == final)


def statuses(ids: list[int]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for status in Experiment.objects.filter(pk__in=ids).values_list("status", flat=True):
        counts[status] = counts.get(status, 0) + 1
    return counts


# --------------------------------------------------------------------------- tests


def test_sigkill_of_a_pool_child_during_each_of_20_experiments_loses_none_and_duplicates_none(
    workers: Workers, quick_target: Callable[..., Target], data_dir: Path,
) -> None:
    target = quick_target(0.5)
    candidate = candidate_commit(target, data_dir)
    worker = workers.start(["experiments"], concurrency=2)
    started = time.monotonic()

    ids = [request(target, candidate).pk for _ in range(20)]
    # Half are killed as soon as they are claimed, half in the middle of their candidate
    # probe, once the baseline execution of that attempt is already recorded.
    mid_probe = set(ids[1::2])
    kills = kill_while_running(
        worker, ids, timeout=240,
        kill_key=lambda pk, attempt: (
            pk if pk not in mid_probe or has_results(pk, attempt) else None))

    elapsed = time.monotonic() - started
    finished = list(Experiment.objects.filter(pk__in=ids))
    succeeded = [e for e in finished if e.status == Experiment.Status.SUCCEEDED]
    attempts = sorted(e.attempts for e in finished)
    # The others are killed as soon as the test sees them claimed, which on a loaded machine
    # can be after their baseline is recorded too: only the mid-probe half is asserted.
    killed_mid_probe = sum(k.executions_before >= 1 for k in kills.values()
                           if k.experiment in mid_probe)
    probes_killed = set().union(*(k.descendants for k in kills.values()))
    # Probe supervisors die with their parent (pdeathsig); what escapes that, such as a
    # sandbox started after the tree was listed, is killed by the worker
    # (infraops.experiments.orphans).
    # Every experiment is finished: nothing may still run in the test's data folder.
    settle = time.monotonic() + 20
    while (alive(probes_killed) or running_in(data_dir)) and time.monotonic() < settle:
        time.sleep(0.2)
    survivors = alive(probes_killed) | running_in(data_dir)
    figure("sigkill_pool_child_killed", f"{len(kills)}/20", "experiments")
    figure("sigkill_pool_child_killed_mid_probe", f"{killed_mid_probe}/20", "experiments")
    figure("sigkill_pool_child_recorded", f"{len(succeeded)}/20", "experiments")
    figure("sigkill_pool_child_duplicates", duplicate_executions(ids), "rows")
    figure("sigkill_pool_child_attempts", f"min={attempts[0]} max={attempts[-1]}", "attempts")
    figure("sigkill_pool_child_probe_processes_left", len(survivors), "processes")
    figure("sigkill_pool_child_wall", f"{elapsed:.1f}", "s")
    assert len(kills) == 20
    assert killed_mid_probe == len(mid_probe)
    assert statuses(ids) == {Experiment.Status.SUCCEEDED: 20}, [
        (e.pk, e.status, e.failure_reason) for e in finished]
    assert duplicate_executions(ids) == 0
    # One kill costs exactly one extra attempt, and only the last one's results count.
    assert attempts == [2] * 20
    assert all(recorded_once(e) for e in finished)
    assert not survivors, described(survivors)  # a dead worker leaves no probe running


def test_sigkill_of_the_whole_worker_with_work_queued_then_restart_records_all(
    workers: Workers, quick_target: Callable[..., Target], data_dir: Path,
) -> None:
    target = quick_target(0.5)
    candidate = candidate_commit(target, data_dir)
    first = workers.start(["experiments"], concurrency=1, label="doomed")
    ids = [request(target, candidate).pk for _ in range(10)]

    wait_until(lambda: Experiment.objects.filter(pk__in=ids, status="running").exists(),
               timeout=60, interval=0.02, what="the first experiment to start")
    dead_pids = first.pids()
    first.kill_tree()
    assert first.process.returncode == -signal.SIGKILL
    killed = list(Experiment.objects.filter(pk__in=ids, status="running")
                  .values_list("pk", flat=True))
    dead_holders = {f"{socket.gethostname()}:{pid}" for pid in dead_pids}
    workers.start(["experiments"], concurrency=1, label="restarted")

    # Time passing, simulated for the dead only: leases held by killed processes are
    # expired (a live holder renews its own), and the reaper runs as beat would every 30 s.
    resent: list[int] = []
    idle_since: float | None = None
    next_reap = time.monotonic()
    deadline = time.monotonic() + 120
    while Experiment.objects.filter(pk__in=ids, status__in=OPEN).exists():
        assert time.monotonic() < deadline, statuses(ids)
        Experiment.objects.filter(pk__in=ids, status="running", claimed_by__in=dead_holders,
                                  lease_expires_at__gt=timezone.now()
                                  ).update(lease_expires_at=timezone.now())
        running = Experiment.objects.filter(pk__in=ids, status="running").exists()
        idle_since = None if running else (idle_since or time.monotonic())
        if idle_since is not None and time.monotonic() - idle_since > 5:
            # Nothing runs but work is queued: its message was lost; let two minutes pass.
            Experiment.objects.filter(pk__in=ids, status="queued").update(
                enqueued_at=timezone.now() - experiment_service.REQUEUE_QUEUED_AFTER)
            idle_since = None
        if time.monotonic() >= next_reap:  # beat's 30 s, shortened
            resent += experiments_reap()
            next_reap = time.monotonic() + 5
        time.sleep(0.5)

    finished = list(Experiment.objects.filter(pk__in=ids))
    figure("sigkill_worker_killed_while_running", len(killed), "experiments")
    figure("sigkill_worker_recorded", f"{statuses(ids).get('succeeded', 0)}/10", "experiments")
    figure("sigkill_worker_duplicates", duplicate_executions(ids), "rows")
    figure("sigkill_worker_reaped", len(resent), "resends")
    # What the dead tree was running, sandboxes started as it was killed included, is gone
    # (parent-death signals; the next sandbox's start ends a dead worker's control groups).
    settle = time.monotonic() + 20
    while running_in(data_dir) and time.monotonic() < settle:
        time.sleep(0.2)
    leftovers = running_in(data_dir)
    figure("sigkill_worker_processes_left", len(leftovers), "processes")
    assert len(killed) == 1
    assert statuses(ids) == {Experiment.Status.SUCCEEDED: 10}, [
        (e.pk, e.status, e.failure_reason) for e in finished]
    assert duplicate_executions(ids) == 0
    assert all(recorded_once(e) for e in finished)
    assert not leftovers, described(leftovers)
    assert {e.pk: e.attempts for e in finished if e.attempts != 1} == {killed[0]: 2}
    assert set(resent) == set(killed)  # the queued messages survived the kill in Redis


def test_a_poison_experiment_fails_after_exactly_n_attempts_while_the_others_succeed(
    workers: Workers, quick_target: Callable[..., Target], data_dir: Path,
) -> None:
    target = quick_target(0.5)
    candidate = candidate_commit(target, data_dir)
    worker = workers.start(["experiments"], concurrency=2)

    poison = request(target, candidate)
    others = [request(target, candidate).pk for _ in range(5)]
    kills = kill_while_running(
        worker, [poison.pk, *others], timeout=120,
        kill_key=lambda pk, attempt: (pk, attempt) if pk == poison.pk else None)

    poison.refresh_from_db()
    figure("poison_attempts", poison.attempts, "attempts")
    figure("poison_kills", len(kills), "kills")
    figure("poison_others_succeeded", f"{statuses(others).get('succeeded', 0)}/5", "experiments")
    assert poison.status == Experiment.Status.FAILED
    assert "poison" in poison.failure_reason
    assert poison.attempts == poison.max_attempts == 3
    assert sorted(kills, key=str) == [(poison.pk, 1), (poison.pk, 2), (poison.pk, 3)]
    assert statuses(others) == {Experiment.Status.SUCCEEDED: 5}
    assert all(recorded_once(e) for e in Experiment.objects.filter(pk__in=others))
    assert set(Experiment.objects.filter(pk__in=others).values_list("attempts", flat=True)) == {1}


def test_an_experiment_longer_than_the_visibility_timeout_runs_once(
    workers: Workers, quick_target: Callable[..., Target], data_dir: Path, settings: Any,
) -> None:
    # The product derives the visibility timeout as 1.5 x the hard time limit, so no setting
    # lets a task outlive it: the worker is started through a wrapper that sets it to 5 s.
    assert (settings.CELERY_BROKER_TRANSPORT_OPTIONS["visibility_timeout"]
            >= 1.5 * settings.CELERY_TASK_TIME_LIMIT)
    target = quick_target(6)  # two sides: about 12 s, more than twice the timeout
    candidate = candidate_commit(target, data_dir)
    worker = workers.start(["experiments"], concurrency=2, visibility_timeout=5)

    experiment = request(target, candidate)
    wait_until(lambda: Experiment.objects.filter(pk=experiment.pk, status__in=OPEN).count() == 0,
               timeout=90, interval=0.2, what="the long experiment to finish")

    experiment.refresh_from_db()
    received = re.findall(r"Task infraops\.tasks\.experiment_execute\[([0-9a-f-]+)\] received",
                          worker.log_text())
    figure("visibility_deliveries", len(received), "deliveries")
    figure("visibility_attempts", experiment.attempts, "attempts")
    figure("visibility_executions", experiment.executions.count(), "rows")
    assert len(received) == 2 and len(set(received)) == 1  # Redis did redeliver it
    assert experiment.status == Experiment.Status.SUCCEEDED, experiment.failure_reason
    assert experiment.attempts == 1
    assert set(experiment.executions.values_list("attempt", flat=True)) == {1}
    assert recorded_once(experiment)


def test_routing_sends_a_gpu_probe_only_to_a_worker_consuming_experiments_gpu(
    workers: Workers, quick_target: Callable[..., Target], data_dir: Path,
) -> None:
    target = quick_target(0.5, gpu=True)
    candidate = candidate_commit(target, data_dir)
    plain = workers.start(["experiments"], concurrency=1, label="plain")

    waiting = missing_worker_message("experiments.gpu")
    gpu_experiment = request(target, candidate, probes=("gpu-bench",))
    cpu_experiment = request(target, candidate, probes=("latency-bench",))
    assert (cpu_experiment.queue, gpu_experiment.queue) == ("experiments", "experiments.gpu")
    wait_until(lambda: Experiment.objects.get(pk=cpu_experiment.pk).status == "succeeded",
               timeout=60, what="the cpu experiment")
    time.sleep(2)  # the plain worker is idle now, and still must not take the gpu one
    gpu_experiment.refresh_from_db()
    assert waiting is not None and waiting.startswith("Waiting for a worker with gpu")
    assert gpu_experiment.status == Experiment.Status.QUEUED
    assert gpu_experiment.attempts == 0

    gpu = workers.start(["experiments.gpu"], concurrency=1, label="gpu")
    assert missing_worker_message("experiments.gpu") is None
    later_cpu = [request(target, candidate, probes=("latency-bench",)).pk for _ in range(2)]
    ids = [gpu_experiment.pk, cpu_experiment.pk, *later_cpu]
    wait_until(lambda: not Experiment.objects.filter(pk__in=ids, status__in=OPEN).exists(),
               timeout=60, what="the gpu experiment and the later cpu ones")

    ran_on = {}
    for experiment in Experiment.objects.filter(pk__in=ids):
        pid = holder_pid(experiment.claimed_by)
        owner = workers.owner_of(pid) if pid else None
        ran_on[experiment.pk] = owner.name if owner else None
    figure("routing_gpu_on_gpu_worker", int(ran_on[gpu_experiment.pk] == gpu.name), "bool")
    figure("routing_cpu_on_plain_worker",
           sum(ran_on[pk] == plain.name for pk in [cpu_experiment.pk, *later_cpu]), "of 3")
    if host_has_gpu():
        assert statuses(ids) == {Experiment.Status.SUCCEEDED: 4}
    else:  # routed all the same: the gpu worker took it, and says it has no GPU to give it
        assert statuses([*later_cpu, cpu_experiment.pk]) == {Experiment.Status.SUCCEEDED: 3}
        gpu_experiment.refresh_from_db()
        assert "requires a GPU, and this worker's host has no GPU device node" in (
            gpu_experiment.failure_reason)
    assert ran_on == {gpu_experiment.pk: gpu.name, cpu_experiment.pk: plain.name,
                      **dict.fromkeys(later_cpu, plain.name)}


def test_an_experiment_past_the_soft_time_limit_fails_at_once_with_a_clear_reason(
    workers: Workers, quick_target: Callable[..., Target], data_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    target = quick_target(4)  # two sides: about 8 s, past a 5 s soft limit
    candidate = candidate_commit(target, data_dir)
    worker = workers.start(["experiments"], concurrency=1,
                           env={"INFRAOPS_TASK_TIME_LIMIT": "6"})
    # Celery writes the sender's limits (the task's, bound from settings once and cached with
    # its execution options) into the message; the worker obeys those, not its own settings.
    monkeypatch.setattr(tasks.experiment_execute, "time_limit", 6)
    monkeypatch.setattr(tasks.experiment_execute, "soft_time_limit", 5)
    monkeypatch.setattr(tasks.experiment_execute, "_exec_options", None)
    experiment = request(target, candidate)

    started = time.monotonic()
    while time.monotonic() - started < 25 and not experiment.is_finished:
        time.sleep(0.2)
        experiment.refresh_from_db()

    figure("soft_time_limit_status", f"{experiment.status}@{time.monotonic() - started:.0f}s",
           "status")
    if "Soft time limit (5s) exceeded" not in worker.log_text():
        pytest.fail("precondition: the soft time limit never fired in the worker")
    assert experiment.status == Experiment.Status.FAILED
    assert experiment.attempts == 1
    assert "time limit" in experiment.failure_reason


def test_a_killed_attempt_leaves_no_worktree_behind(
    workers: Workers, quick_target: Callable[..., Target], data_dir: Path,
) -> None:
    target = quick_target(1)
    candidate = candidate_commit(target, data_dir)
    worker = workers.start(["experiments"], concurrency=1)

    experiment = request(target, candidate)
    kills = kill_while_running(  # in the middle of the candidate probe
        worker, [experiment.pk], timeout=60,
        kill_key=lambda pk, attempt: pk if has_results(pk, attempt) else None)

    experiment.refresh_from_db()
    if (len(kills), experiment.status, experiment.attempts) != (1, "succeeded", 2):
        pytest.fail(f"precondition: one kill, then success at attempt 2; got {len(kills)} "
                    f"kills, {experiment.status} at attempt {experiment.attempts}")
    # The successful attempt cleans up after it has recorded success: wait for its task's end.
    wait_until(lambda: re.search(r"experiment_execute\[.*\] succeeded", worker.log_text()),
               timeout=30, what="the successful task to return")
    work = data_dir / "work"
    leftovers = sorted(p.name for p in work.iterdir()) if work.exists() else []
    listing = gitops.git(target.clone_path, "worktree", "list", "--porcelain")
    linked = [line for line in listing.splitlines() if line.startswith("worktree ")][1:]
    figure("killed_attempt_leftover_dirs", len(leftovers), "dirs")
    figure("killed_attempt_leftover_worktrees", len(linked), "worktrees")
    assert leftovers == []
    assert linked == []
