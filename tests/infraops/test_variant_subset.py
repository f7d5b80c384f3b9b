"""Variant subsets and cancellation of experiments (infraops/experiments/services.py), run
in-process through the sandbox: an experiment asked for some variant cells of a probe runs only
those; the compare rules and criteria that need a cell it did not run say "not run in this
experiment" instead of failing; a queued experiment can be cancelled and its task then finds
nothing to run.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from infraops import gitops, tasks
from infraops.errors import DomainError
from infraops.experiments.services import (
    experiment_cancel,
    experiment_claim,
    experiment_execute,
    experiment_request,
    experiments_reap,
)
from infraops.feedback.criteria import criterion_cells
from infraops.models import Experiment, Target, parse_variant, variant_key
from infraops.services.targets import target_register
from infraops.signals import experiment_finished
from reviews.services.facts import evidence_facts
from tests.conftest import make_origin

WORKER = "subset:1"

MANIFEST = """
[[probe]]
name = "grid"
layer = "performance"
command = "python3 -S bench/grid.py"
covers = ["lib/**"]
variants = {batch = ["1", "8"], dtype = ["fp32", "fp16"]}
compare = {reference = {dtype = "fp32"}, candidate = {dtype = "fp16"}, rtol = 1e-3}
metrics = ["step_ms"]
repeat = 3
warmup = 0
files = ["bench/grid.py"]

[[probe]]
name = "modes"
layer = "correctness"
command = "python3 -S bench/modes.py"
covers = ["lib/**"]
variants = {mode = ["a", "b"]}
warmup = 0
files = ["bench/modes.py"]
"""

# Same outputs under both dtypes (the compare rule holds); fp16 is twice as fast.
GRID = """
import json, os
batch, dtype = int(os.environ["BATCH"]), os.environ["DTYPE"]
repeat = int(os.environ["INFRAOPS_REPEAT"])
out = os.environ["INFRAOPS_OUT"]
os.makedirs(out + "/outputs", exist_ok=True)
json.dump([batch * 1.0, 2.0], open(out + "/outputs/result.json", "w"))
ms = batch * (1.0 if dtype == "fp32" else 0.5) * (1 + 0.01 * repeat)
open(out + "/metrics.jsonl", "w").write(json.dumps({"name": "step_ms", "value": ms}) + "\\n")
"""

MODES = """
import json, os
out = os.environ["INFRAOPS_OUT"] + "/outputs"
os.makedirs(out, exist_ok=True)
json.dump([1.0, 2.0], open(out + "/" + os.environ["MODE"] + ".json", "w"))
"""


@pytest.fixture
def grid_target(db: None, tmp_path: Path) -> Target:
    source = tmp_path / "grid-src"
    (source / "bench").mkdir(parents=True)
    (source / "lib").mkdir()
    (source / "infraops.toml").write_text(MANIFEST)
    (source / "bench" / "grid.py").write_text(GRID)
    (source / "bench" / "modes.py").write_text(MODES)
    (source / "lib" / "code.py").write_text("VALUE = 1\n")
    origin = make_origin(tmp_path, source, "grid.git")
    return target_register(name="grid", repo_url=str(origin), base_branch="main")


@pytest.fixture
def candidate(grid_target: Target, tmp_path: Path) -> str:
    """A commit that changes lib/, which both probes cover."""
    tree = tmp_path / "candidate"
    gitops.worktree_add(grid_target.clone_path, tree, grid_target.manifest_commit)
    (tree / "lib" / "code.py").write_text("VALUE = 2\n")
    sha = gitops.commit_all(tree, "value 2", author_name="t", author_email="t@t")
    gitops.worktree_remove(grid_target.clone_path, tree)
    assert sha is not None
    return sha


@pytest.fixture
def request_grid(grid_target: Target, candidate: str,
                 django_capture_on_commit_callbacks: Callable[..., Any]
                 ) -> Callable[..., Experiment]:
    """experiment_request on the candidate, its task's send captured (nothing reaches a
    broker)."""

    def make(**kwargs: Any) -> Experiment:
        with django_capture_on_commit_callbacks(execute=False):
            return experiment_request(target=grid_target, candidate_commit=candidate,
                                      baseline_commit=grid_target.manifest_commit,
                                      origin="test", **kwargs)

    return make


def executed(experiment: Experiment) -> Experiment:
    result = experiment_execute(experiment_id=experiment.pk, worker=WORKER)
    assert result is not None
    assert result.status == Experiment.Status.SUCCEEDED, result.failure_reason
    return result


def findings(experiment: Experiment, kind: str) -> list[dict[str, Any]]:
    return [f for f in experiment.feedback["findings"] if f["kind"] == kind]


def criterion(cid: int, kind: str, variant: str, reference: str = "", value: float = 100.0
              ) -> dict[str, Any]:
    return {"id": cid, "kind": kind, "probe": "grid", "metric": "step_ms", "variant": variant,
            "reference_variant": reference, "comparison": "<=", "value": value,
            "name": f"criterion {cid}", "description": f"criterion {cid}"}


# --------------------------------------------------------------------------- choosing cells


def test_only_the_chosen_cells_run_and_unnamed_probes_run_every_cell(
    request_grid: Callable[..., Experiment],
) -> None:
    experiment = request_grid(probes=["grid", "modes"],
                              variants={"grid": [" dtype = fp16 , batch=8 "]})

    assert experiment.variants == {"grid": ["batch=8,dtype=fp16"]}  # canonical
    result = executed(experiment)
    ran = {(e.probe, e.variant) for e in result.executions.all()}
    assert ran == {("grid", "batch=8,dtype=fp16"), ("modes", "mode=a"), ("modes", "mode=b")}
    grid = result.executions.filter(probe="grid", repeat_index__gte=0)
    assert grid.count() == 3 * 2  # repeat = 3, both sides
    assert {c["variant"] for c in result.summary["comparisons"]} == {"batch=8,dtype=fp16"}


def test_cells_are_stored_in_matrix_order_without_duplicates(
    request_grid: Callable[..., Experiment],
) -> None:
    experiment = request_grid(probes=["grid"], variants={
        "grid": ["dtype=fp16,batch=8", "batch=1,dtype=fp32", "batch = 8, dtype = fp16"]})

    assert experiment.variants == {"grid": ["batch=1,dtype=fp32", "batch=8,dtype=fp16"]}


@pytest.mark.parametrize(("variants", "phrases"), [
    ({"grid": ["batch=4,dtype=fp16"]},
     ["Probe 'grid' has no variant cell 'batch=4,dtype=fp16'", "[batch=1,dtype=fp32]",
      "[batch=8,dtype=fp16]"]),
    ({"grid": ["batch=8"]}, ["no variant cell 'batch=8'", "[batch=1,dtype=fp16]"]),
    ({"grid": ["fp16"]}, ["'fp16' is not key=value", "[batch=8,dtype=fp32]"]),
    ({"modes": ["mode=a"]}, ["Variants name probe 'modes'", "its probes: grid"]),
    ({"grid": []}, ["No variant cell chosen for probe 'grid'"]),
])
def test_a_cell_or_probe_that_does_not_exist_is_refused_and_nothing_is_queued(
    request_grid: Callable[..., Experiment], variants: dict[str, list[str]],
    phrases: list[str],
) -> None:
    with pytest.raises(DomainError) as raised:
        request_grid(probes=["grid"], variants=variants)

    for phrase in phrases:
        assert phrase in str(raised.value)
    assert not Experiment.objects.exists()


def test_a_criterions_cells_are_canonical_as_variant_key_spells_them() -> None:
    # Sorted by key, not by the 'k=v' text: 'a=..' sorts after 'a0=..' as text.
    spec = {"kind": "relation", "variant": "a0=1, a=2", "reference_variant": "a = 1,a0=1"}

    assert criterion_cells(spec) == [variant_key(parse_variant("a0=1,a=2")),
                                     variant_key(parse_variant("a=1,a0=1"))]
    assert criterion_cells(spec) == ["a=2,a0=1", "a=1,a0=1"]
    assert criterion_cells({"kind": "threshold", "variant": ""}) == []


# --------------------------------------------------------------------------- what needs a cell


def test_a_compare_rule_whose_cells_did_not_run_is_reported_not_run(
    request_grid: Callable[..., Experiment],
) -> None:
    result = executed(request_grid(probes=["grid"],
                                   variants={"grid": ["batch=8,dtype=fp16"]}))

    [note] = findings(result, "rule-not-run")
    assert note["severity"] == "info"
    assert note["title"] == "grid [dtype=fp16] vs [dtype=fp32] not run in this experiment"
    assert "2 of 2 pairs" in note["detail"]
    assert note["evidence"]["not_run"] == ["batch=1,dtype=fp16", "batch=1,dtype=fp32",
                                           "batch=8,dtype=fp32"]
    assert not [f for f in result.feedback["findings"] if f["severity"] == "fail"]


def test_a_compare_rule_checks_the_pairs_that_ran_and_names_the_others(
    request_grid: Callable[..., Experiment],
) -> None:
    result = executed(request_grid(probes=["grid"], variants={
        "grid": ["batch=8,dtype=fp16", "batch=8,dtype=fp32"]}))

    [note] = findings(result, "rule-not-run")
    assert "1 of 2 pairs" in note["detail"]
    assert note["evidence"]["pairs"] == [["batch=1,dtype=fp16", "batch=1,dtype=fp32"]]
    checked = {f["evidence"]["compared"] for f in findings(result, "outputs-match")}
    assert "[batch=8,dtype=fp16] vs [batch=8,dtype=fp32] (candidate)" in checked
    assert not any("batch=1" in label for label in checked)


def test_a_criterion_on_a_cell_not_run_is_not_run_rather_than_failed(
    request_grid: Callable[..., Experiment],
) -> None:
    criteria = [criterion(1, "threshold", "dtype=fp16, batch=8"),
                criterion(2, "threshold", "batch=1,dtype=fp32"),
                criterion(3, "relation", "batch=8,dtype=fp16", "batch=8,dtype=fp32", 0.0)]
    result = executed(request_grid(probes=["grid"], criteria=criteria,
                                   variants={"grid": ["batch=8,dtype=fp16"]}))

    by_id = {f["evidence"]["criterion"]: f for f in result.feedback["findings"]
             if f["layer"] == "criteria"}
    assert by_id[1]["kind"] == "criterion" and by_id[1]["severity"] == "pass"
    for cid, cell in ((2, "batch=1,dtype=fp32"), (3, "batch=8,dtype=fp32")):
        assert by_id[cid]["kind"] == "criterion-not-run"
        assert by_id[cid]["severity"] == "info"
        assert by_id[cid]["detail"].startswith("not run in this experiment")
        assert by_id[cid]["evidence"]["not_run"] == [cell]
        assert by_id[cid]["evidence"]["verdict"]["passed"] is False
    # The merge gate still finds them not established.
    verdicts = {v.criterion_id: v.passed for v in evidence_facts(result).criteria}
    assert verdicts == {1: True, 2: False, 3: False}


def test_without_variants_every_cell_runs_and_every_rule_is_checked(
    request_grid: Callable[..., Experiment],
) -> None:
    experiment = request_grid(probes=["grid"])

    assert experiment.variants == {}
    result = executed(experiment)
    assert {e.variant for e in result.executions.all()} == {
        variant_key({"batch": b, "dtype": d}) for b in ("1", "8") for d in ("fp16", "fp32")}
    assert findings(result, "rule-not-run") == []


# --------------------------------------------------------------------------- cancelling


def test_a_queued_experiment_is_cancelled_and_its_task_then_skips_it(
    request_grid: Callable[..., Experiment],
    django_capture_on_commit_callbacks: Callable[..., Any],
) -> None:
    experiment = request_grid(probes=["modes"])
    sent: list[int] = []

    def notice(sender: Any, *, experiment_id: int, **kwargs: Any) -> None:
        sent.append(experiment_id)

    experiment_finished.connect(notice)
    try:
        with django_capture_on_commit_callbacks(execute=True):
            assert experiment_cancel(experiment=experiment, reason="superseded by 12") is True
    finally:
        experiment_finished.disconnect(notice)

    assert experiment.status == Experiment.Status.CANCELLED
    assert experiment.failure_reason == "superseded by 12"
    assert experiment.finished_at is not None
    assert sent == [experiment.pk]  # waiting runs wake
    tasks.experiment_execute(experiment.pk)  # the worker receives its message later
    assert experiment_execute(experiment_id=experiment.pk, worker=WORKER) is None
    experiment.refresh_from_db()
    assert experiment.status == Experiment.Status.CANCELLED
    assert experiment.attempts == 0 and experiment.claimed_by == ""
    assert not experiment.executions.exists()


def test_a_cancelled_experiment_is_not_re_sent_by_the_reaper(
    request_grid: Callable[..., Experiment],
) -> None:
    experiment = request_grid(probes=["modes"])
    assert experiment_cancel(experiment=experiment, reason="not needed")
    # Long enough ago that a queued one would be re-sent as probably lost.
    Experiment.objects.filter(pk=experiment.pk).update(
        enqueued_at=experiment.created_at.replace(year=2000))

    assert experiments_reap() == []


def test_a_running_experiment_is_left_running(request_grid: Callable[..., Experiment]) -> None:
    experiment = request_grid(probes=["modes"])
    assert experiment_claim(experiment_id=experiment.pk, worker=WORKER) is not None

    assert experiment_cancel(experiment=experiment, reason="too late") is False

    experiment.refresh_from_db()
    assert experiment.status == Experiment.Status.RUNNING
    assert experiment.failure_reason == "" and experiment.finished_at is None


def test_a_finished_experiment_is_not_cancelled(request_grid: Callable[..., Experiment]) -> None:
    result = executed(request_grid(probes=["modes"]))

    assert experiment_cancel(experiment=result, reason="after the fact") is False

    result.refresh_from_db()
    assert result.status == Experiment.Status.SUCCEEDED
    assert result.failure_reason == ""
