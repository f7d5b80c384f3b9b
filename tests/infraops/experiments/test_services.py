"""infraops/experiments/services.py run in-process (no Celery worker): request, claim with a
lease, sandboxed probes with ABBA-interleaved sides, stored samples, reaping and poison experiments;
and the target page for a target whose manifest is broken."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import threading
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.utils import timezone

from agents.models import AgentRun
from infraops import gitops
from infraops.experiments import sandbox
from infraops.experiments import services as experiments_service
from infraops.experiments.analysis import attempt_executions, attempt_samples
from infraops.experiments.results import read_metrics
from infraops.experiments.sandbox import check, launch
from infraops.experiments.services import (
    experiment_claim,
    experiment_execute,
    experiment_request,
    experiments_reap,
)
from infraops.feedback.samples import compare_samples, per_execution_rows
from infraops.models import Experiment, ProbeExecution, Sample, Target
from infraops.services.targets import target_register
from tests.conftest import make_origin, members_of_new_target
from tests.factories import ExperimentFactory, GoalFactory, TargetFactory

WORKER = "test:1"


def candidate_commit(target: Target, data_dir: Path, batch_size: int = 8) -> str:
    """A commit on top of the target's base that changes batch_size, as an agent would make."""
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


@pytest.fixture
def request_experiment(
    django_capture_on_commit_callbacks: Callable, data_dir: Path,
) -> Callable[..., Experiment]:
    """experiment_request on a fresh candidate commit (config/ changed, which latency-bench
    covers), with its after-commit send captured: nothing reaches a broker."""

    def make(target: Target, **extra: Any) -> Experiment:
        candidate = candidate_commit(target, data_dir)
        with django_capture_on_commit_callbacks(execute=False) as callbacks:
            experiment = experiment_request(target=target, candidate_commit=candidate,
                                            baseline_commit=target.manifest_commit,
                                            origin="test", **extra)
        assert len(callbacks) == 1  # the task is sent after commit, once
        return experiment

    return make


def register_variant(tmp_path: Path, source: Path, name: str, **fields: str) -> Target:
    """Register a copy of the example whose latency-bench probe has other `fields`."""
    manifest = source / "infraops.toml"
    text = manifest.read_text()
    for key, value in fields.items():
        text, count = re.subn(rf"(?m)^{key} = .*$", f"{key} = {value}".replace("\\", r"\\"),
                              text, count=1)
        assert count == 1, key
    manifest.write_text(text)
    return members_of_new_target(target_register(
        name=name, repo_url=str(make_origin(tmp_path, source, f"{name}.git")),
        base_branch="main"))


# --------------------------------------------------------------------------- a full experiment


@pytest.fixture
def finished_experiment(
    example_target: Target, request_experiment: Callable[..., Experiment]
) -> Experiment:
    experiment = request_experiment(example_target)
    result = experiment_execute(experiment_id=experiment.pk, worker=WORKER)
    assert result is not None
    return result


def test_an_experiment_on_a_candidate_commit_succeeds(finished_experiment: Experiment) -> None:
    assert finished_experiment.status == Experiment.Status.SUCCEEDED, (
        finished_experiment.failure_reason)
    assert finished_experiment.failure_reason == ""
    assert finished_experiment.attempts == 1
    assert finished_experiment.claimed_by == WORKER
    assert finished_experiment.finished_at is not None
    assert finished_experiment.lease_expires_at is None


def test_probe_executions_interleave_the_sides_in_abba_order(
    finished_experiment: Experiment,
) -> None:
    executions = list(finished_experiment.executions.order_by("id"))

    # latency-bench: no warm-up (the default), repeat = 5, two sides; under load a look of
    # extra repeats (10 more a side at most, in two stages) may follow, and one more repeat
    # when a side's first execution is a first-run outlier.
    assert not any(e.is_warmup for e in executions)
    repeats = len(executions) // 2
    assert repeats in (5, 6, 10, 11, 15, 16)
    # ABBA: the side that goes first alternates per repeat, so an order effect cancels out.
    abba = ["baseline", "candidate", "candidate", "baseline"]
    assert [e.side for e in executions] == (abba * repeats)[:2 * repeats]
    assert [e.repeat_index for e in executions] == [i // 2 for i in range(2 * repeats)]
    # Every execution's seed is stored: one for all the samples.
    seeds = {e.seed for e in executions}
    assert len(seeds) == 1 and None not in seeds
    assert {e.probe for e in executions} == {"latency-bench"}
    assert all(e.reason == "ok" and e.exit_code == 0 for e in executions)
    assert all(e.attempt == 1 for e in executions)
    assert "batch_size=2" in executions[0].stdout
    assert "batch_size=8" in executions[1].stdout


def test_a_warm_up_the_probe_asks_for_runs_first_under_a_second_seed(
    tmp_path: Path, example_source: Path, db: None,
    request_experiment: Callable[..., Experiment],
) -> None:
    target = register_variant(tmp_path, example_source, "warmed",
                              repeat="5\nwarmup = 1\nextra_repeats = 0")
    result = experiment_execute(experiment_id=request_experiment(target).pk, worker=WORKER)

    assert result is not None and result.status == Experiment.Status.SUCCEEDED
    everything = list(result.executions.order_by("id"))
    warmups, executions = everything[:2], everything[2:]
    assert [(e.side, e.repeat_index, e.is_warmup) for e in warmups] == [
        ("baseline", -1, True), ("candidate", -1, True)]
    assert [e.repeat_index for e in executions][:10] == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    assert not any(e.is_warmup for e in executions)
    seeds = {e.seed for e in executions}
    assert {e.seed for e in warmups} != seeds and len({e.seed for e in warmups}) == 1
    # A warm-up's metrics are never samples.
    assert not Sample.objects.filter(execution__in=warmups).exists()


def test_an_experiment_given_a_seed_runs_every_sample_under_it(
    tmp_path: Path, example_source: Path, db: None,
    request_experiment: Callable[..., Experiment],
) -> None:
    # An agent run's experiments share one seed (common random numbers): its configurations
    # are compared on the same inputs. The warm-up still runs under a seed of its own.
    target = register_variant(tmp_path, example_source, "seeded",
                              repeat="2\nwarmup = 1\nextra_repeats = 0")
    result = experiment_execute(
        experiment_id=request_experiment(target, seed=2**31 - 5).pk, worker=WORKER)

    assert result is not None and result.status == Experiment.Status.SUCCEEDED
    samples = result.executions.filter(repeat_index__gte=0)
    assert samples.count() == 4 and {e.seed for e in samples} == {2**31 - 5}
    warmups = {e.seed for e in result.executions.filter(repeat_index__lt=0)}
    assert len(warmups) == 1 and 2**31 - 5 not in warmups


# A probe whose value is its batch size (the candidate's is 8, the baseline's 2), a little
# more each repeat; LOADED_PROBE hits one baseline execution with load, FIRST_RUN_PROBE makes
# a fresh checkout's first run pay for a cache it leaves in the tree (as bytecode is).
PROBE_HEAD = """import json, os, pathlib, re
batch = int(re.search(r"(?m)^batch_size = (\\d+)$",
                      pathlib.Path("config/serving.toml").read_text()).group(1))
repeat = int(os.environ["INFRAOPS_REPEAT"])
value = batch * (1 + 0.001 * repeat)
"""
PROBE_TAIL = """with open(os.environ["INFRAOPS_OUT"] + "/metrics.jsonl", "w") as out:
    out.write(json.dumps({"name": "latency_ms", "value": value}) + "\\n")
"""
LOADED_PROBE = PROBE_HEAD + """if batch == 2 and repeat == 2:
    value *= 20  # the baseline's third execution, hit by load: it outranks every candidate
""" + PROBE_TAIL
FIRST_RUN_PROBE = PROBE_HEAD + """cache = pathlib.Path("__pycache__/first-run-paid")
if not cache.exists():
    value *= 1.2
    cache.parent.mkdir(exist_ok=True)
    cache.touch()
""" + PROBE_TAIL


def run_scripted(tmp_path: Path, source: Path, name: str, script: str,
                 request_experiment: Callable[..., Experiment]) -> Experiment:
    (source / "bench" / "scripted.py").write_text(script)
    target = register_variant(tmp_path, source, name, command='"python3 bench/scripted.py"')
    result = experiment_execute(experiment_id=request_experiment(target).pk, worker=WORKER)
    assert result is not None and result.status == Experiment.Status.SUCCEEDED, (
        result and result.failure_reason)
    return result


def latency_comparison(experiment: Experiment) -> dict:
    [finding] = [f for f in experiment.feedback["findings"] if f["kind"] == "perf-comparison"]
    return finding


def test_a_regression_one_loaded_execution_hides_is_decided_by_extra_repeats(
    tmp_path: Path, example_source: Path, db: None,
    request_experiment: Callable[..., Experiment],
) -> None:
    result = run_scripted(tmp_path, example_source, "loaded", LOADED_PROBE, request_experiment)

    finding = latency_comparison(result)
    comparison = finding["evidence"]["comparison"]
    # Five a side could not call it (the loaded execution outranks every candidate), nor ten;
    # the last look of the default budget (10 more a side) does.
    assert comparison["verdict"] == "regressed", finding["detail"]
    assert (comparison["look"], comparison["looks"], comparison["n_baseline"]) == (3, 3, 15)
    assert "look 3 of 3 (15 a side" in finding["detail"]
    executions = list(result.executions.order_by("id"))
    assert [e.repeat_index for e in executions] == [i // 2 for i in range(30)]
    abba = ["baseline", "candidate", "candidate", "baseline"]
    assert [e.side for e in executions] == (abba * 8)[:30]  # the extra repeats interleave too


def test_no_extra_repeats_when_the_probe_states_no_budget(
    tmp_path: Path, example_source: Path, db: None,
    request_experiment: Callable[..., Experiment],
) -> None:
    (example_source / "bench" / "scripted.py").write_text(LOADED_PROBE)
    target = register_variant(tmp_path, example_source, "loaded-no-budget",
                              command='"python3 bench/scripted.py"',
                              repeat="5\nextra_repeats = 0")
    result = experiment_execute(experiment_id=request_experiment(target).pk, worker=WORKER)

    assert result is not None and result.executions.count() == 10
    assert latency_comparison(result)["evidence"]["comparison"]["verdict"] == "inconclusive"


def test_a_first_run_outlier_is_left_out_and_replaced_without_a_warm_up(
    tmp_path: Path, example_source: Path, db: None,
    request_experiment: Callable[..., Experiment],
) -> None:
    result = run_scripted(tmp_path, example_source, "first-run", FIRST_RUN_PROBE,
                          request_experiment)

    executions = list(result.executions.order_by("id"))
    # No warm-up: the first execution of each side, 20% slower, is left out of the samples'
    # comparison and one more repeat takes its place: six executions a side, not seven.
    assert not any(e.is_warmup for e in executions)
    assert [e.repeat_index for e in executions] == [i // 2 for i in range(12)]
    finding = latency_comparison(result)
    comparison = finding["evidence"]["comparison"]
    assert comparison["verdict"] == "regressed", finding["detail"]
    assert comparison["n_baseline"] == comparison["n_candidate"] == 5
    assert comparison["baseline_median"] == pytest.approx(2.006)
    assert "the baseline and candidate's first execution left out: a first-run outlier" in (
        finding["detail"])


# A probe that "compiles" into its compile cache a kernel of its own code (the candidate's
# differs: batch size 8, the baseline's 2) when it is not there yet, memoises its result under
# its seed there, and leaves a file outside the cache too (the candidate one more); its value
# says whether it paid for the compilation (+5) or found a memo of its own seed (+100).
COMPILE_CACHE_PROBE = PROBE_HEAD + """cache = pathlib.Path(os.environ["INFRAOPS_CACHE"])
assert os.environ["TRITON_CACHE_DIR"] == str(cache / "triton"), os.environ["TRITON_CACHE_DIR"]
kernel = cache / "triton" / f"kernel-{batch}.bin"
memo = cache / ("memo-" + os.environ["INFRAOPS_SEED"])
cold, memo_seen = not kernel.exists(), memo.exists()
kernel.parent.mkdir(parents=True, exist_ok=True)
kernel.write_text("compiled")
memo.write_text("result")
pathlib.Path("left-" + ("by-candidate" if batch == 8 else "by-both")).write_text("x")
pathlib.Path("left-by-both").write_text("x")
print(f"cold={cold:d} memo={memo_seen:d}")
value = 10 * (1 + 0.001 * repeat) + 5 * cold + 100 * memo_seen
""" + PROBE_TAIL


def test_a_compile_cache_is_filled_once_a_side_off_the_samples_and_no_sample_leaves_state(
    tmp_path: Path, example_source: Path, db: None,
    request_experiment: Callable[..., Experiment],
) -> None:
    (example_source / "bench" / "scripted.py").write_text(COMPILE_CACHE_PROBE)
    # A cache committed with the code: binaries no one compiled from its source. Removed.
    committed = example_source / ".infraops-cache" / "triton"
    committed.mkdir(parents=True)
    for batch in (2, 8):
        (committed / f"kernel-{batch}.bin").write_text("planted")
    target = register_variant(tmp_path, example_source, "compile-cache",
                              command='"python3 bench/scripted.py"',
                              repeat="5\ncompile_cache = true\nextra_repeats = 0")
    # The run's seed is known to its agent: a fill told it could compute the samples' results
    # ahead, so the samples of a probe with a compile cache get a seed of the attempt's own.
    result = experiment_execute(
        experiment_id=request_experiment(target, seed=2**31 - 5).pk, worker=WORKER)

    assert result is not None and result.status == Experiment.Status.SUCCEEDED, (
        result and result.failure_reason)
    executions = list(result.executions.order_by("id"))
    # Each side's first execution fills its cache, under the second seed, never a sample;
    # then the samples, ABBA: every one found the kernel and no memo of its own seed (the
    # samples share a seed: a memo a sample wrote was thrown away with its work tree).
    abba = [("baseline", 0), ("candidate", 0), ("candidate", 1), ("baseline", 1)]
    assert [(e.side, e.repeat_index) for e in executions] == [
        ("baseline", -1), ("candidate", -1),
        *[(side, repeat + 2 * (i // 4)) for i, (side, repeat) in enumerate(abba * 3)][:10]]
    assert [e.stdout.strip() for e in executions] == ["cold=1 memo=0"] * 2 + [
        "cold=0 memo=0"] * 10
    samples = result.executions.filter(repeat_index__gte=0)
    assert len({e.seed for e in samples}) == 1 and samples[0].seed != 2**31 - 5
    assert {e.seed for e in executions[:2]}.isdisjoint({e.seed for e in samples})
    values = sorted(Sample.objects.filter(execution__in=samples).values_list("value", flat=True))
    assert values == pytest.approx([10 * (1 + 0.001 * (i // 2)) for i in range(10)])
    # What the candidate left outside the cache is still named; its cache (its own kernels,
    # which the baseline's cache does not hold) is not.
    [left] = [f for f in result.feedback["findings"] if f["kind"] == "left-behind"]
    assert left["evidence"]["files"] == ["left-by-candidate"], left


def test_a_compile_cache_file_changed_after_its_fill_is_left_behind(tmp_path: Path) -> None:
    # What a fill left in the cache is exempt as it left it; a file changed or added there
    # afterwards (by another probe's execution, whose writes are kept) is not.
    cache = tmp_path / ".infraops-cache" / "triton"
    cache.mkdir(parents=True)
    (cache / "kernel.bin").write_text("compiled")
    (cache / "other.bin").write_text("compiled")
    filled = experiments_service.cache_listing(tmp_path)
    assert sorted(filled) == [".infraops-cache/triton/kernel.bin",
                              ".infraops-cache/triton/other.bin"]
    assert experiments_service.left_behind(tmp_path, set(), filled=filled) == []
    (cache / "other.bin").write_text("memoised result")
    (cache / "memo").write_text("x")
    assert experiments_service.left_behind(tmp_path, set(), filled=filled) == [
        ".infraops-cache/triton/memo", ".infraops-cache/triton/other.bin"]


def test_samples_are_stored_for_both_sides(finished_experiment: Experiment) -> None:
    # One latency sample an execution: five a side, or more where load took a further look.
    for side in ("baseline", "candidate"):
        samples = Sample.objects.filter(experiment=finished_experiment, side=side)
        assert samples.count() == finished_experiment.executions.filter(side=side).count() >= 5
        assert all(s.metric == "latency_ms" and s.unit == "ms" and s.value > 0 for s in samples)
    candidate_labels = Sample.objects.filter(experiment=finished_experiment, side="candidate")
    assert {s.labels["batch_size"] for s in candidate_labels} == {8}


def test_the_summary_compares_the_medians_of_latency(finished_experiment: Experiment) -> None:
    comparisons = finished_experiment.summary["comparisons"]
    latency = [c for c in comparisons if c["metric"] == "latency_ms"]

    assert finished_experiment.summary["attempt"] == 1
    assert len(latency) == 1
    row = latency[0]
    assert row["probe"] == "latency-bench"
    # Five a side (a first-run outlier left out and replaced), more after a further look.
    assert row["baseline_n"] == row["candidate_n"] >= 5
    assert row["baseline_median"] > 0 and row["candidate_median"] > 0
    assert row["ratio"] == pytest.approx(row["candidate_median"] / row["baseline_median"])


def test_the_summary_is_what_the_stored_samples_give(finished_experiment: Experiment) -> None:
    # The worker summarises the samples it kept in memory; they must be the stored ones.
    stored = attempt_samples(attempt_executions(finished_experiment.pk, 1))
    assert len(stored) == finished_experiment.executions.count() >= 10
    expected = [c.as_dict() for c in compare_samples(per_execution_rows(stored))]
    assert finished_experiment.summary["comparisons"] == expected


def test_the_manifest_hash_is_recorded(
    finished_experiment: Experiment, example_target: Target
) -> None:
    assert re.fullmatch(r"[0-9a-f]{64}", finished_experiment.manifest_sha256)
    assert finished_experiment.manifest_sha256 == example_target.manifest_sha256


def test_the_worktrees_and_outputs_are_cleaned_up(
    finished_experiment: Experiment, example_target: Target, data_dir: Path
) -> None:
    assert gitops._linked_worktrees(example_target.clone_path) == set()
    assert not (data_dir / "work" / f"exp-{finished_experiment.pk}-a1").exists()


def test_executing_a_finished_experiment_again_does_nothing(
    finished_experiment: Experiment,
) -> None:
    executions, samples = ProbeExecution.objects.count(), Sample.objects.count()

    again = experiment_execute(experiment_id=finished_experiment.pk, worker="test:2")

    assert again is None
    assert ProbeExecution.objects.count() == executions
    assert Sample.objects.count() == samples
    finished_experiment.refresh_from_db()
    assert finished_experiment.status == Experiment.Status.SUCCEEDED
    assert finished_experiment.attempts == 1
    assert finished_experiment.claimed_by == WORKER


# --------------------------------------------------------------------------- leases


def test_a_second_worker_cannot_claim_while_the_lease_is_live(
    example_target: Target, request_experiment: Callable[..., Experiment]
) -> None:
    experiment = request_experiment(example_target)

    first = experiment_claim(experiment_id=experiment.pk, worker=WORKER)
    second = experiment_claim(experiment_id=experiment.pk, worker="test:2")

    assert first is not None
    assert first.status == Experiment.Status.RUNNING
    assert first.attempts == 1
    assert first.lease_expires_at is not None and first.lease_expires_at > timezone.now()
    assert second is None
    experiment.refresh_from_db()
    assert experiment.claimed_by == WORKER


@pytest.mark.django_db(transaction=True)
def test_two_workers_claiming_the_same_experiments_at_once_get_each_exactly_once() -> None:
    target = TargetFactory.create(name="race", repo_url="file:///nowhere")
    ids = [ExperimentFactory.create(target=target, candidate_commit="1" * 40,
                                    baseline_commit="0" * 40).pk for _ in range(30)]
    start = threading.Barrier(2)
    won: dict[str, list[int]] = {}

    def claim_all(worker: str) -> None:
        start.wait()
        try:
            won[worker] = [pk for pk in ids if experiment_claim(experiment_id=pk, worker=worker)]
        finally:
            connection.close()  # this thread's own

    threads = [threading.Thread(target=claim_all, args=(f"race:{n}",)) for n in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(won["race:1"] + won["race:2"]) == ids
    for pk, attempts, claimed_by in Experiment.objects.filter(pk__in=ids).values_list(
            "pk", "attempts", "claimed_by"):
        assert attempts == 1
        assert pk in won[claimed_by]


def test_recording_the_same_execution_twice_in_one_attempt_keeps_one(
    example_target: Target, request_experiment: Callable[..., Experiment], tmp_path: Path,
) -> None:
    experiment = request_experiment(example_target)
    claimed = experiment_claim(experiment_id=experiment.pk, worker=WORKER)
    assert claimed is not None
    out = tmp_path / "out"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"name": "latency_ms", "value": 3.5}\n')
    attempt = experiments_service._Attempt(
        claimed, experiments_service._Lease(claimed.pk, WORKER, claimed.attempts), tmp_path,
        sandbox.sandbox_identity(), trees={}, before_candidate=lambda: None)
    result = sandbox.SandboxResult(exit_code=0, reason="ok", detail="exited with status 0",
                                   stdout=b"", stderr=b"", output_truncated=False,
                                   wall_seconds=0.1)

    slot = experiments_service._Slot(repeat=0, seed=7)
    first = experiments_service._record(attempt, "latency-bench", "baseline", "", slot, result,
                                        out)
    again = experiments_service._record(attempt, "latency-bench", "baseline", "", slot, result,
                                        out)

    assert [row.value for row in first] == [3.5] and again == []
    assert ProbeExecution.objects.filter(experiment=claimed).count() == 1
    assert Sample.objects.filter(experiment=claimed).count() == 1


def test_an_expired_lease_is_reaped_and_the_next_claim_is_a_new_attempt(
    example_target: Target, request_experiment: Callable[..., Experiment],
    django_capture_on_commit_callbacks: Callable,
) -> None:
    experiment = request_experiment(example_target)
    assert experiment_claim(experiment_id=experiment.pk, worker=WORKER) is not None
    assert experiments_reap() == []  # a live lease is left alone

    Experiment.objects.filter(pk=experiment.pk).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1))
    with django_capture_on_commit_callbacks(execute=False) as sends:
        reaped = experiments_reap()
    claimed = experiment_claim(experiment_id=experiment.pk, worker="test:2")

    assert reaped == [experiment.pk]
    assert len(sends) == 1  # re-sent after commit
    assert claimed is not None
    assert claimed.attempts == 2
    assert claimed.claimed_by == "test:2"
    assert claimed.lease_expires_at is not None and claimed.lease_expires_at > timezone.now()


def test_an_experiment_queued_for_long_is_re_sent_by_the_reaper(
    example_target: Target, request_experiment: Callable[..., Experiment],
    django_capture_on_commit_callbacks: Callable,
) -> None:
    fresh = request_experiment(example_target)
    old = request_experiment(example_target)
    Experiment.objects.filter(pk=old.pk).update(
        enqueued_at=timezone.now() - timedelta(minutes=10))

    with django_capture_on_commit_callbacks(execute=False) as sends:
        reaped = experiments_reap()

    assert reaped == [old.pk]
    assert len(sends) == 1
    fresh.refresh_from_db()
    assert fresh.status == Experiment.Status.QUEUED


def test_a_live_lease_of_a_dead_process_on_this_host_is_taken_over_at_once(
    example_target: Target, request_experiment: Callable[..., Experiment],
) -> None:
    experiment = request_experiment(example_target)
    dead = subprocess.Popen(["true"])
    dead.wait()
    Experiment.objects.filter(pk=experiment.pk).update(
        status=Experiment.Status.RUNNING, attempts=1,
        claimed_by=f"{socket.gethostname()}:{dead.pid}",
        lease_expires_at=timezone.now() + timedelta(minutes=1))

    claimed = experiment_claim(experiment_id=experiment.pk, worker="test:2")

    assert claimed is not None
    assert claimed.claimed_by == "test:2"
    assert claimed.attempts == 2


def test_a_poison_experiment_is_failed_on_its_next_claim(
    example_target: Target, request_experiment: Callable[..., Experiment]
) -> None:
    experiment = request_experiment(example_target)
    Experiment.objects.filter(pk=experiment.pk).update(
        status=Experiment.Status.RUNNING, max_attempts=2, attempts=2, claimed_by="dead:1",
        lease_expires_at=timezone.now() - timedelta(seconds=1))

    result = experiment_execute(experiment_id=experiment.pk, worker=WORKER)

    assert result is None
    experiment.refresh_from_db()
    assert experiment.status == Experiment.Status.FAILED
    assert "poison" in experiment.failure_reason
    assert experiment.attempts == 2
    assert experiment.lease_expires_at is None
    assert not experiment.executions.exists()


# --------------------------------------------------------------------------- failures


def test_a_probe_that_exits_non_zero_fails_the_experiment_and_names_the_probe(
    tmp_path: Path, example_source: Path, db: None,
    request_experiment: Callable[..., Experiment],
) -> None:
    target = register_variant(tmp_path, example_source, "exits-three",
                              command="'python3 -c \"import sys; sys.exit(3)\"'")
    experiment = request_experiment(target)

    result = experiment_execute(experiment_id=experiment.pk, worker=WORKER)

    assert result is not None
    assert result.status == Experiment.Status.FAILED
    assert "latency-bench" in result.failure_reason
    assert "status 3" in result.failure_reason
    execution = result.executions.get()  # the first failure stops the rest
    assert execution.exit_code == 3
    assert execution.reason == "exit"


def test_without_a_sandbox_the_experiment_fails_and_nothing_runs_unconfined(
    example_target: Target, data_dir: Path, request_experiment: Callable[..., Experiment],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(launch, "BWRAP", str(data_dir / "no-such-bwrap"))
    monkeypatch.setattr(check, "_check_cache", {})
    experiment = request_experiment(example_target)

    result = experiment_execute(experiment_id=experiment.pk, worker=WORKER)

    assert result is not None
    assert result.status == Experiment.Status.FAILED
    assert "sandbox" in result.failure_reason.lower()
    assert "bwrap" in result.failure_reason
    assert not ProbeExecution.objects.filter(experiment=result).exists()
    assert not Sample.objects.filter(experiment=result).exists()


@pytest.mark.parametrize(("line", "reason"), [
    ("'not json'", "Expecting value"),
    # Issue 26: this line ended the experiment with "unexpected error RecursionError" and
    # stored no execution; one under the line limit is nested too deep to parse.
    ("'[' * 200_000", "longer than 65536 characters"),
    ("'[' * 60_000", "nested too deep to read"),
    # A 40 MB labels object was stored again with every sample of its execution.
    ("json.dumps({'name': 'm', 'value': 1, 'labels': {'a': 'x' * 40_000_000}})",
     "longer than 65536 characters"),
], ids=["not-json", "200k-brackets", "60k-brackets", "40mb-labels"])
def test_a_malformed_metrics_line_is_skipped_and_named_while_good_lines_are_stored(
    tmp_path: Path, example_source: Path, db: None,
    request_experiment: Callable[..., Experiment], line: str, reason: str,
) -> None:
    (example_source / "bench" / "bad_line.py").write_text(
        "import json, os\n"
        "with open(os.environ['INFRAOPS_OUT'] + '/metrics.jsonl', 'w') as out:\n"
        f"    out.write({line} + '\\n')\n"
        "    out.write(json.dumps({'name': 'latency_ms', 'value': 1.5, 'unit': 'ms'}) + '\\n')\n")
    target = register_variant(tmp_path, example_source, "half-bad-metrics",
                              command='"python3 bench/bad_line.py"', repeat="1")
    experiment = request_experiment(target)

    result = experiment_execute(experiment_id=experiment.pk, worker=WORKER)

    assert result is not None
    assert result.status == Experiment.Status.SUCCEEDED, result.failure_reason
    executions = list(result.executions.filter(repeat_index__gte=0).order_by("id"))
    assert len(executions) == 2
    for execution in executions:
        assert f"metrics.jsonl line 1 skipped: {reason}" in execution.detail, execution.detail
        assert [(s.metric, s.value) for s in execution.samples.all()] == [("latency_ms", 1.5)]


def test_a_probe_printing_a_nul_byte_is_still_recorded(
    tmp_path: Path, example_source: Path, db: None,
    request_experiment: Callable[..., Experiment],
) -> None:
    good = json.dumps({"name": "latency_ms", "value": 1.5, "unit": "ms"})
    script = f"printf 'binary\\000output'; echo '{good}' > $INFRAOPS_OUT/metrics.jsonl"
    target = register_variant(tmp_path, example_source, "nul-stdout",
                              command=json.dumps(script), repeat="1")
    experiment = request_experiment(target)

    result = experiment_execute(experiment_id=experiment.pk, worker=WORKER)

    assert result is not None
    assert result.status == Experiment.Status.SUCCEEDED, result.failure_reason
    assert all(e.stdout.startswith("binary") for e in result.executions.all())


def test_a_metric_with_a_nul_character_does_not_lose_the_good_rows(
    tmp_path: Path, example_source: Path, db: None,
    request_experiment: Callable[..., Experiment],
) -> None:
    (example_source / "bench" / "nul_metric.py").write_text(
        "import json, os\n"
        "with open(os.path.join(os.environ['INFRAOPS_OUT'], 'metrics.jsonl'), 'w') as out:\n"
        "    out.write(json.dumps({'name': 'latency_ms', 'value': 1.5}) + '\\n')\n"
        "    out.write(json.dumps({'name': 'lat\\u0000ency', 'value': 2.0,\n"
        "                          'labels': {'k': 'v\\u0000'}}) + '\\n')\n"
    )
    target = register_variant(tmp_path, example_source, "nul-metric",
                              command='"python3 bench/nul_metric.py"', repeat="1")
    experiment = request_experiment(target)

    result = experiment_execute(experiment_id=experiment.pk, worker=WORKER)

    assert result is not None
    assert result.status == Experiment.Status.SUCCEEDED, result.failure_reason
    assert Sample.objects.filter(experiment=result, metric="latency_ms").count() == 2


GOOD_LINE = json.dumps({"name": "latency_ms", "value": 2.5, "unit": "ms", "case": "c1",
                        "labels": {"batch": 4}})


@pytest.mark.parametrize(("bad_line", "problem"), [
    ("not json", "line 2 skipped"),
    ('["a list"]', "not a JSON object"),
    ('{"name": "latency_ms", "unit": "ms"}', "'value'"),
    ('{"value": 1.0}', "'name'"),
    ('{"name": "latency_ms", "value": "nan"}', "not a finite number"),
    ('{"name": "latency_ms", "value": Infinity}', "not a finite number"),
    ('{"name": "latency_ms", "value": "fast"}', "line 2 skipped"),
    ('{"name": "latency_ms", "value": 1, "labels": ["x"]}', "labels must be an object"),
    ('{"name": "latency_ms", "value": 1' + "0" * 400 + "}", "line 2 skipped"),
])
def test_read_metrics_skips_a_malformed_line_and_names_it(
    tmp_path: Path, bad_line: str, problem: str
) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text(f"{GOOD_LINE}\n{bad_line}\n\n{GOOD_LINE}\n")

    rows, problems = read_metrics(path)

    assert rows == [{"name": "latency_ms", "value": 2.5, "unit": "ms", "case": "c1",
                     "labels": {"batch": 4}}] * 2
    assert len(problems) == 1
    assert problems[0].startswith("metrics.jsonl line 2 skipped")
    assert problem in problems[0]


def test_read_metrics_says_when_the_file_is_missing(tmp_path: Path) -> None:
    rows, problems = read_metrics(tmp_path / "metrics.jsonl")

    assert rows == []
    assert problems == ["metrics.jsonl is missing: the probe reported no metrics"]


def test_read_metrics_does_not_follow_a_link_the_probe_planted(tmp_path: Path) -> None:
    secret = tmp_path / "host-file.jsonl"
    secret.write_text(f"{GOOD_LINE}\n")
    (tmp_path / "metrics.jsonl").symlink_to(secret)

    rows, problems = read_metrics(tmp_path / "metrics.jsonl")

    assert rows == []
    assert problems == ["metrics.jsonl is not a regular file: the probe reported no metrics"]


def test_read_metrics_stops_at_the_line_limit(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text(f"{GOOD_LINE}\n" * 5)

    rows, problems = read_metrics(path, limit=3)

    assert len(rows) == 3
    assert problems == ["metrics.jsonl: only the first 3 lines were read"]


# --------------------------------------------------------------------------- the target page


@pytest.fixture
def broken_target(tmp_path: Path, example_source: Path, db: None) -> Target:
    manifest = example_source / "infraops.toml"
    lines = manifest.read_text().splitlines()
    lines.insert(4, "this line is not toml")  # line 5
    manifest.write_text("\n".join(lines) + "\n")
    return members_of_new_target(target_register(name="broken-manifest",
                           repo_url=str(make_origin(tmp_path, example_source, "broken.git")),
                           base_branch="main"))


def test_a_target_with_a_broken_manifest_shows_its_problems_with_the_line(
    broken_target: Target, viewer: User
) -> None:
    client = Client()
    client.force_login(viewer)

    response = client.get(f"/targets/{broken_target.name}/")

    assert response.status_code == 200
    page = response.content.decode()
    assert "infraops.toml has problems" in page
    assert "line 5" in page
    assert "TOML syntax error" in page
    assert broken_target.manifest() is None


def test_starting_a_run_on_a_broken_manifest_redirects_back_with_the_error(
    broken_target: Target, engineer: User
) -> None:
    goal = GoalFactory.create(target=broken_target, name="latency", probe="latency-bench",
                              metric="latency_ms", owner=engineer)
    client = Client()
    client.force_login(engineer)

    response = client.post(f"/goals/{goal.pk}/runs/", follow=True)

    assert response.redirect_chain == [(f"/targets/{broken_target.name}/", 302)]
    page = response.content.decode()
    assert "infraops.toml is invalid" in page
    assert "line 5" in page
    assert not AgentRun.objects.exists()


CRASH = ("python3 -c \"import os; open(os.environ['INFRAOPS_OUT'] + '/metrics.jsonl', 'w'); "
         "import sys; sys.stderr.write('loading config\\n'); "
         "raise RuntimeError('cache shape mismatch: 17 != 16')\"")


def test_a_crashed_probe_reaches_the_agent_with_its_status_reason_and_stderr_tail(
    tmp_path: Path, example_source: Path, db: None,
    request_experiment: Callable[..., Experiment],
) -> None:
    from agents.policies.llm import experiment_text, untrusted

    target = register_variant(tmp_path, example_source, "crashing", command=json.dumps(CRASH))
    experiment = request_experiment(target)

    result = experiment_execute(experiment_id=experiment.pk, worker=WORKER)

    assert result is not None and result.status == Experiment.Status.FAILED
    [crash] = [f for f in result.feedback["findings"] if f["kind"] == "probe-failed"]
    assert crash["severity"] == "fail" and crash["layer"] == "execution"
    assert "exit status 1" in crash["title"] and "reason exit" in crash["detail"]
    assert "Traceback (most recent call last)" in crash["detail"]
    assert "RuntimeError: cache shape mismatch: 17 != 16" in crash["detail"]
    # What ran and what the results say are worded apart.
    assert result.feedback["execution"]["ok"] is False
    assert "1 of 1 probe executions failed" in result.feedback["execution"]["text"]
    # The agent reads it, and the next step tells it to read the crash first.
    text = result.feedback["agent_text"]
    assert "RuntimeError: cache shape mismatch" in text
    assert "1. read the stderr of latency-bench baseline [default]" in text
    shown = untrusted(experiment_text(result))
    assert shown.startswith("<untrusted>") and "cache shape mismatch" in shown
    assert f"Failure: {result.failure_reason}" in shown


def test_the_stderr_tail_is_bounded() -> None:
    from infraops.experiments.analysis import stderr_tail

    long = "\n".join(f"line {i} " + "x" * 200 for i in range(500))
    tail = stderr_tail(long)
    assert len(tail) <= 1503 and tail.endswith("x" * 200)
    assert tail.count("\n") < 25
    assert stderr_tail("") == ""


@pytest.mark.parametrize(("spec", "margin"), [
    ({"min_effect": 0.03}, 0.03), ({"min_effect": None}, 0.01), ({}, 0.01), (None, 0.01),
    ({"min_effect": -1}, 0.01),
])
def test_the_equivalence_margin_is_the_goals_smallest_meaningful_effect(
    spec: dict[str, object] | None, margin: float,
) -> None:
    from infraops.experiments.services import margin_of

    assert margin_of(spec) == margin


def test_an_experiment_keeps_the_margin_it_was_asked_with(
    example_target: Target, data_dir: Path, django_capture_on_commit_callbacks: Callable,
) -> None:
    candidate = candidate_commit(example_target, data_dir)
    with django_capture_on_commit_callbacks(execute=False):
        experiment = experiment_request(target=example_target, candidate_commit=candidate,
                                        baseline_commit=example_target.manifest_commit,
                                        margin=0.025)
    assert experiment.margin == 0.025


@pytest.mark.parametrize(("metric", "probe", "name", "margin"), [
    ("decode.decode_us", "decode", "decode_us", 0.2),   # the goal's own metric
    ("decode.decode_us", "decode", "memory_mb", 0.01),  # any other: the default
    ("decode.decode_us", "prefill", "decode_us", 0.01),
    ("", "prefill", "step_ms", 0.2),                    # blank: every metric
])
def test_the_goals_margin_is_for_the_goals_metric_only(metric: str, probe: str, name: str,
                                                       margin: float) -> None:
    from infraops.experiments.analysis import _Margin

    assert _Margin(0.2, metric).of(probe, name) == margin


def test_a_goal_version_names_the_metric_its_margin_is_for() -> None:
    from infraops.experiments.services import margin_metric_of

    assert margin_metric_of({"probe": "decode", "metric": "decode_us"}) == "decode.decode_us"
    assert margin_metric_of(None) == ""
    assert margin_of_clamped() == [0.01, 0.01, 0.5]


def margin_of_clamped() -> list[float]:
    from infraops.experiments.services import margin_of

    return [margin_of({"min_effect": 1.5}), margin_of({"min_effect": 0}),
            margin_of({"min_effect": 0.5})]


@pytest.mark.parametrize(("metric", "probe", "declared", "margin"), [
    ("decode.decode_us", "decode", 0.05, 0.2),   # the goal's own metric keeps the goal's
    ("decode.decode_us", "prefill", 0.05, 0.05),  # any other: what its manifest entry says
    ("", "prefill", 0.05, 0.05),
    ("", "prefill", None, 0.2),
])
def test_a_metrics_own_margin_is_used_unless_it_is_the_goals_metric(
        metric: str, probe: str, declared: float | None, margin: float) -> None:
    from infraops.experiments.analysis import _Margin

    assert _Margin(0.2, metric).of(probe, "decode_us", declared) == margin


@pytest.mark.parametrize(("bad_line", "problem"), [
    ("[" * 200_000, "longer than 65536 characters"),
    ('{"name": "m", "value": 1, "labels": {"a": ' + "[" * 5000 + "]" * 5000 + "}}",
     "nested too deep to read"),
    ('{"name": "m", "value": 1, "labels": {"a": [[[[1]]]]}}', "nested deeper than 4 levels"),
    ('{"name": "m", "value": 1, "labels": {"blob": "' + "x" * 5000 + '"}}',
     "labels are 5012 characters as JSON; at most 4096"),
    ('{"name": "m", "value": "1"}', 'value "1" is not a finite number: write a JSON number'),
    ('{"name": "m", "value": true}', "value true is not a finite number"),
    ('{"name": "' + "n" * 101 + '", "value": 1}', "is 101 characters; at most 100"),
    ('{"name": "m", "value": 1, "unit": "' + "u" * 41 + '"}', "is 41 characters; at most 40"),
    ('{"name": "m", "value": 1, "case": "' + "c" * 201 + '"}', "is 201 characters; at most 200"),
    ('{"name": 7, "value": 1}', "name must be a string, got 7"),
], ids=["deep-line", "deep-labels", "labels-depth", "labels-size", "string-value",
        "boolean-value", "long-name", "long-unit", "long-case", "number-name"])
def test_read_metrics_refuses_a_malformed_line_whole_with_its_reason(
        tmp_path: Path, bad_line: str, problem: str) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text(f"{GOOD_LINE}\n{bad_line}\n{GOOD_LINE}\n")

    rows, problems = read_metrics(path)

    assert [row["name"] for row in rows] == ["latency_ms", "latency_ms"]
    assert len(problems) == 1 and problems[0].startswith("metrics.jsonl line 2 skipped: ")
    assert problem in problems[0], problems


def test_read_metrics_counts_the_problems_it_does_not_name(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"name": "m", "value": "1"}\n' * 30)

    rows, problems = read_metrics(path)

    assert rows == [] and len(problems) == 20
    assert problems[-1] == "metrics.jsonl: 11 more problems like these"


def test_a_metric_declared_but_never_written_is_named_with_the_closest_written_one() -> None:
    from infraops.experiments.analysis import _metric_names
    from infraops.feedback.samples import SampleRow
    from infraops.manifest import parse_manifest
    from infraops.models import ProbeExecution

    probes = parse_manifest(
        '[[probe]]\nname = "bench"\nlayer = "performance"\ncommand = "x"\n'
        'metrics = ["wrk_ms", "rss_mb"]\n'
        '[[probe]]\nname = "unit"\nlayer = "correctness"\ncommand = "x"\n').probes
    ran = [ProbeExecution(probe=name, side="candidate", repeat_index=0, reason="ok")
           for name in ("bench", "unit")]
    rows = [SampleRow("bench", "candidate", "", metric, 1.0)
            for metric in ("work_ms", "rss_mb", "spills")]
    rows.append(SampleRow("unit", "candidate", "", "elements", 1.0))  # it declares none

    [found] = _metric_names(probes, rows, ran)

    assert (found.severity, found.title) == ("warn", "bench writes other metrics than it "
                                                     "declares")
    assert found.detail.startswith(
        "declared wrk_ms is never written (closest written: work_ms); written spills is not "
        "declared; written work_ms is not declared (closest declared: wrk_ms): a goal")
    assert (found.evidence["missing"], found.evidence["undeclared"]) == (
        ["wrk_ms"], ["spills", "work_ms"])
    assert _metric_names(probes, rows[1:2], []) == []  # nothing ran: nothing to say


@pytest.mark.parametrize(("metric", "worst", "share"), [
    ("max_abs_error", 2e-12, 2e-3),  # round-off growing from 5e-14 under atol 1e-9
    ("max_rel_error", 5e-7, 0.5),    # halfway to rtol 1e-6: worth watching
])
def test_a_growing_error_is_weighed_against_the_tolerance(metric: str, worst: float,
                                                          share: float) -> None:
    from infraops.experiments.analysis import WATCH_SHARE, _Pair, _share_of_tolerance
    from infraops.feedback.correctness import ErrorSeries

    series = ErrorSeries(points=((64.0, worst / 40), (1024.0, worst)), slope=1.3,
                         growing=True, detail="grows", metric=metric)
    pair = _Pair("rule", None, None, None, None, None, rtol=1e-6, atol=1e-9)

    assert _share_of_tolerance(series, pair) == pytest.approx(share)
    assert (share < WATCH_SHARE) is (metric == "max_abs_error")


@pytest.mark.parametrize(("worst", "severity", "words"), [
    (2e-12, "info", "at most 0.002 of the tolerance: round-off far inside it"),
    (5e-10, "warn", "grows with size"),  # half the tolerance: worth watching
], ids=["round-off", "half-the-tolerance"])
def test_an_error_growing_far_inside_the_tolerance_is_a_note_not_a_warning(
        tmp_path: Path, worst: float, severity: str, words: str) -> None:
    from infraops.experiments.analysis import _Context, _Pair, _pair_findings
    from infraops.feedback.correctness import CaseComparison
    from infraops.manifest import parse_manifest

    manifest = parse_manifest('[[probe]]\nname = "merge"\nlayer = "correctness"\n'
                              'command = "x"\n')
    # Every case matches (atol 1e-9); the error grows 40-fold from 64 to 4096 elements.
    matches = [CaseComparison(f"n{size}", "match", (size,), "float64", worst * share,
                              worst * share, 1, 0, None, None, float(size), f"n{size} matches")
               for size, share in ((64, 0.025), (256, 0.1), (1024, 0.3), (4096, 1.0))]
    context = _Context(Experiment(pk=1), manifest, list(manifest.probes), {}, tmp_path, {})
    pair = _Pair("candidate vs baseline [default]", None, None, None, None, None, rtol=1e-5,
                 atol=1e-9)

    found = _pair_findings(context, manifest.probes[0], pair, matches, "fail")

    [series] = [f for f in found if f.kind == "error-vs-size"]
    assert series.severity == severity and words in series.detail, series.detail
    assert not [f for f in found if f.severity == "fail"]


def test_a_time_measured_under_the_instruction_counter_is_not_judged_and_says_so() -> None:
    from infraops.experiments.analysis import _Margin, _performance
    from infraops.manifest import parse_manifest

    [probe] = parse_manifest('[[probe]]\nname = "count"\nlayer = "performance"\n'
                             'command = "x"\nmetrics = ["wall_ms"]\nmeasure = "instructions"\n'
                             ).probes
    samples = {("count", "", "wall_ms", "", "baseline"): [900.0, 905, 910, 1500, 902],
               ("count", "", "wall_ms", "", "candidate"): [880.0, 2100, 890, 884, 905],
               ("count", "", "instructions", "", "baseline"): [1e9] * 5,
               ("count", "", "instructions", "", "candidate"): [1e9] * 5}

    found = _performance([probe], samples, seed=1, margin=_Margin(0.01, ""))

    assert [(f.kind, f.title) for f in found] == [
        ("perf-comparison", "count instructions no change"),
        ("not-judged", "count wall_ms not judged")]
    assert "under the instruction counter" in found[1].detail


@pytest.mark.parametrize(("measure", "asks"), [("instructions", False), ("wall", True)])
def test_a_time_the_instrument_distorts_never_asks_for_extra_repeats(measure: str, asks: bool
                                                                     ) -> None:
    from infraops.experiments.analysis import look_state
    from infraops.feedback.samples import SampleRow
    from infraops.manifest import parse_manifest

    [probe] = parse_manifest('[[probe]]\nname = "count"\nlayer = "performance"\n'
                             f'command = "x"\nmetrics = ["wall_ms"]\nmeasure = "{measure}"\n'
                             ).probes
    # A 3x slower wall time that one slow baseline run hides from five repeats a side.
    values = {"baseline": [900.0, 905, 3100, 902, 910], "candidate": [2700.0, 2710, 2690, 2705,
                                                                       2720]}
    rows = [SampleRow(probe="count", side=side, variant="", metric="wall_ms", value=value,
                      execution=2 * index + (side == "candidate") + 1)
            for side, series in values.items() for index, value in enumerate(series)]
    rows += [SampleRow(probe="count", side=side, variant="", metric="instructions", value=1e9,
                       execution=2 * index + (side == "candidate") + 1)
             for side in values for index in range(5)]

    state = look_state(Experiment(pk=1), probe, "", rows)

    # Under the instruction counter only the counts are judged, and they are equal.
    assert state.more_would_decide is asks
    assert not state.first_run_outlier


@pytest.mark.parametrize(("metric", "asks"), [("rel_error", False), ("merge_us", True)])
def test_only_a_speed_asks_for_extra_repeats(metric: str, asks: bool) -> None:
    from infraops.experiments.analysis import look_state
    from infraops.feedback.samples import SampleRow
    from infraops.manifest import parse_manifest

    [probe] = parse_manifest('[[probe]]\nname = "merge"\nlayer = "performance"\n'
                             f'command = "x"\nmetrics = ["{metric}"]\nrepeat = 3\n').probes
    # A 100-fold fall that three repeats a side cannot call (p >= 0.1 at best): for an
    # error that is the fix, settled by the goal's criteria; a time is worth more repeats.
    values = {"baseline": [1e-2, 1.01e-2, 0.99e-2], "candidate": [1e-4, 1.01e-4, 0.99e-4]}
    rows = [SampleRow(probe="merge", side=side, variant="", metric=metric, value=value,
                      execution=2 * index + (side == "candidate") + 1)
            for side, series in values.items() for index, value in enumerate(series)]

    assert look_state(Experiment(pk=1), probe, "", rows).more_would_decide is asks


@pytest.mark.parametrize(("criteria", "margin_metric", "asks"), [
    ([], "", True),  # asked nothing in particular: every time counts
    ([{"kind": "threshold", "probe": "merge", "metric": "rel_error"}], "", False),
    ([{"kind": "threshold", "probe": "merge", "metric": "rel_error"}], "merge.rel_error", False),
    ([{"kind": "relative", "probe": "merge", "metric": "merge_us"}], "merge.rel_error", True),
    ([], "merge.merge_us", True),
    ([{"kind": "relative", "probe": "other", "metric": "merge_us"}], "", False),
])
def test_extra_repeats_are_spent_only_on_what_the_experiment_was_asked(
    criteria: list[dict[str, str]], margin_metric: str, asks: bool,
) -> None:
    from infraops.experiments.analysis import look_state
    from infraops.feedback.samples import SampleRow
    from infraops.manifest import parse_manifest

    [probe] = parse_manifest('[[probe]]\nname = "merge"\nlayer = "performance"\ncommand = "x"\n'
                             'metrics = ["rel_error", "merge_us"]\nrepeat = 3\n').probes
    # A 3.5x slower merge that three repeats a side cannot call (p >= 0.1 at best), and an
    # error 2,000 times smaller: a GPU precision fix, whose question is its error.
    values = {("rel_error", "baseline"): [1e-3, 1.1e-3, 0.9e-3],
              ("rel_error", "candidate"): [5e-7, 5.1e-7, 4.9e-7],
              ("merge_us", "baseline"): [1800.0, 1810, 1790],
              ("merge_us", "candidate"): [6400.0, 6410, 6390]}
    rows = [SampleRow(probe="merge", side=side, variant="", metric=metric, value=value,
                      execution=2 * index + (side == "candidate") + 1)
            for (metric, side), series in values.items() for index, value in enumerate(series)]
    experiment = Experiment(pk=1, criteria=criteria, margin_metric=margin_metric)

    assert look_state(experiment, probe, "", rows).more_would_decide is asks
