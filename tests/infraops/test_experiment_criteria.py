"""The experiment page's criteria table (infraops.views.criteria_rows): every criterion the
experiment was run against, with its verdict once the feedback has one."""

from __future__ import annotations

from typing import Any

from infraops.models import Experiment
from infraops.views import criteria_rows

SPECS = [{"id": 3, "name": "fast", "description": "p.latency_ms vs baseline <= -5.0%"},
         {"id": 4, "name": "wide", "description": "p.latency_ms [b=8] <= 10"},
         {"id": 5, "name": "kept", "description": "p.latency_ms <= 12"}]


def judged(criterion: int, kind: str, passed: bool) -> dict[str, Any]:
    return {"layer": "criteria", "kind": kind, "evidence": {
        "criterion": criterion, "verdict": {"passed": passed, "detail": f"measured {criterion}"}}}


def test_a_running_experiment_lists_its_criteria_as_pending() -> None:
    rows = criteria_rows(Experiment(criteria=SPECS, status=Experiment.Status.RUNNING))

    assert [(r["name"], r["state"]) for r in rows] == [
        ("fast", "pending"), ("wide", "pending"), ("kept", "pending")]
    assert rows[0]["condition"] == "p.latency_ms vs baseline <= -5.0%"


def test_a_finished_experiment_shows_each_verdict_and_says_which_were_never_judged() -> None:
    feedback = {"findings": [
        {"layer": "performance", "kind": "faster", "evidence": {"verdict": "x"}},
        judged(3, "criterion", True), judged(4, "criterion-not-run", False)]}
    rows = criteria_rows(Experiment(criteria=SPECS, status=Experiment.Status.SUCCEEDED,
                                    feedback=feedback))

    assert [r["state"] for r in rows] == ["passed", "not run", "not judged"]
    assert rows[0]["verdict"]["detail"] == "measured 3"


def test_a_failing_criterion_reads_failed() -> None:
    rows = criteria_rows(Experiment(criteria=SPECS[:1], status=Experiment.Status.SUCCEEDED,
                                    feedback={"findings": [judged(3, "criterion", False)]}))

    assert rows[0]["state"] == "failed"
