"""reviews.gate: each condition failing alone keeps the change waiting, with its reason."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from reviews import gate

HEAD, BASE = "h" * 40, "b" * 40
CRITERION = {"id": 7, "kind": "relative", "probe": "e2e-serve", "metric": "latency_ms",
             "variant": "", "reference_variant": "", "comparison": "<=", "value": -0.05,
             "description": "e2e-serve.latency_ms vs baseline <= -5.0%"}
MEASURED = {k: CRITERION[k] for k in ("kind", "probe", "metric", "variant",
                                      "reference_variant", "comparison", "value")}
MICRO = gate.PerformanceResult("kernel-bench", "us", "improved", "kernel-bench us improved",
                               "ratio 0.800 (95% CI 0.780-0.820)")
E2E = gate.PerformanceResult("e2e-serve", "latency_ms", "improved",
                             "e2e-serve latency_ms improved", "ratio 0.930 (95% CI 0.910-0.950)")
PROBES = (gate.ProbeFact("kernel-bench", "performance", 10),
          gate.ProbeFact("e2e-serve", "e2e", 100))


def evidence(**changes: object) -> gate.EvidenceFacts:
    base = gate.EvidenceFacts(
        experiment_id=3, status="succeeded", candidate_commit=HEAD, baseline_commit=BASE,
        probes_run=("kernel-bench", "e2e-serve"), failing=(), integrity=(),
        criteria=(gate.CriterionVerdict(7, MEASURED, True,
                                        "candidate vs baseline -7.00% (95% CI -9.0% to -5.1%)"),),
        performance=(MICRO, E2E))
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def facts(**changes: object) -> gate.ChangeFacts:
    base = gate.ChangeFacts(
        head_commit=HEAD, base_commit=BASE, branch="main", branch_tip=BASE, goal_version=2,
        auto_merge=True, criteria=(CRITERION,), risk=(), evidence=evidence(),
        covering_probes=PROBES)
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def failing(checks: list[gate.Check]) -> dict[str, str]:
    return {c.name: c.detail for c in checks if not c.passed}


def test_a_change_meeting_every_condition_passes_the_gate() -> None:
    checks = gate.merge_gate(facts())

    assert failing(checks) == {}
    assert gate.gate_passed(checks)
    assert [c.name for c in checks] == [
        "auto-merge", "risk", "analysed", "criteria-defined", "criterion-7", "evidence",
        "feedback", "integrity", "end-to-end", "base"]


NUMERIC = gate.RiskFact("numerics", "kda/merge.py", 12, "requests TF32 inputs for a dot product")

ALONE: list[tuple[str, Callable[[], gate.ChangeFacts], str, str]] = [
    ("auto-merge-off", lambda: facts(auto_merge=False), "auto-merge",
     "goal v2 does not allow automatic merge"),
    ("no-goal-version", lambda: facts(goal_version=None), "auto-merge", "no pinned goal version"),
    ("risky-line", lambda: facts(risk=(NUMERIC,)), "risk",
     "numerics: 1 finding (first kda/merge.py:12: requests TF32"),
    ("unclassified-file", lambda: facts(risk=(gate.RiskFact("unclassified", "lib/k.so", None,
                                                            "binary file"),)),
     "analysed", "unclassified: lib/k.so (binary file)"),
    ("no-criteria", lambda: facts(criteria=()), "criteria-defined", "has no acceptance criterion"),
    ("criterion-failed", lambda: facts(evidence=evidence(criteria=(
        gate.CriterionVerdict(7, MEASURED, False, "candidate vs baseline -2.00% (95% CI "
                              "-4.0% to +0.1%)"),))), "criterion-7", "-2.00%"),
    ("criterion-unmeasured", lambda: facts(evidence=evidence(criteria=())), "criterion-7",
     "not measured: experiment 3 did not evaluate this criterion"),
    ("criterion-edited-since", lambda: facts(evidence=evidence(criteria=(
        gate.CriterionVerdict(7, MEASURED | {"value": -0.01}, True, "ok"),))), "criterion-7",
     "as goal v2 states it"),
    ("evidence-not-succeeded", lambda: facts(evidence=evidence(status="failed")), "evidence",
     "experiment 3 failed"),
    ("baseline-elsewhere", lambda: facts(evidence=evidence(baseline_commit="c" * 40)),
     "evidence", "not the change's base"),
    ("failing-finding", lambda: facts(evidence=evidence(failing=(
        "cp-check [cp=on] vs [cp=off] (candidate) case n4096 differs",))), "feedback",
     "1 failing in experiment 3: cp-check"),
    ("integrity-flag", lambda: facts(evidence=evidence(integrity=(
        "cp-check case n64 output is all zero: the computation was probably skipped",))),
     "integrity", "all zero"),
    ("micro-win-only", lambda: facts(evidence=evidence(performance=(
        MICRO, dataclasses.replace(E2E, verdict="no change", detail="ratio 1.001")))),
     "end-to-end", "not confirmed end to end"),
    ("e2e-not-run", lambda: facts(evidence=evidence(performance=(MICRO,),
                                                    probes_run=("kernel-bench",)),),
     "end-to-end", "e2e-serve (e2e, cost 100), the costliest probe covering the changed paths, "
     "did not report"),
    ("e2e-regressed", lambda: facts(evidence=evidence(performance=(
        MICRO, dataclasses.replace(E2E, verdict="regressed", detail="ratio 1.080")))),
     "end-to-end", "e2e-serve (e2e, cost 100) regressed: ratio 1.080"),
    ("no-probe-confirms", lambda: facts(covering_probes=()), "end-to-end",
     "no e2e or performance probe of the manifest covers the changed paths"),
    ("base-moved", lambda: facts(branch_tip="d" * 40), "base", "main moved from bbbbbbbbbb to "
     "dddddddddd"),
    ("branch-unreadable", lambda: facts(branch_tip=None), "base", "main cannot be read"),
]


@pytest.mark.parametrize(("make", "check", "reason"), [a[1:] for a in ALONE],
                         ids=[a[0] for a in ALONE])
def test_each_condition_failing_alone_keeps_the_change_waiting_with_the_reason(
    make: Callable[[], gate.ChangeFacts], check: str, reason: str
) -> None:
    checks = gate.merge_gate(make())

    assert not gate.gate_passed(checks)
    assert list(failing(checks)) == [check]
    assert reason in failing(checks)[check]


def test_with_the_head_measured_elsewhere_the_criteria_and_evidence_fail() -> None:
    checks = gate.merge_gate(facts(evidence=evidence(candidate_commit="e" * 40)))

    assert set(failing(checks)) == {"criterion-7", "evidence"}
    assert "measured on eeeeeeeeee, not on the change's head hhhhhhhhhh" in failing(
        checks)["criterion-7"]


def test_without_evidence_every_evidence_check_fails_closed() -> None:
    checks = gate.merge_gate(facts(evidence=None))

    assert set(failing(checks)) == {"criterion-7", "evidence", "feedback", "integrity",
                                    "end-to-end"}


def test_a_gain_measured_by_the_costliest_probe_itself_is_confirmed() -> None:
    checks = gate.merge_gate(facts(covering_probes=(PROBES[0],), evidence=evidence(
        performance=(MICRO,), probes_run=("kernel-bench",))))

    assert failing(checks) == {}


def test_no_performance_gain_needs_no_end_to_end_confirmation() -> None:
    checks = gate.merge_gate(facts(evidence=evidence(performance=())))

    end_to_end = next(c for c in checks if c.name == "end-to-end")
    assert end_to_end.passed and end_to_end.detail == "no performance gain is claimed"


def test_only_a_moved_base_means_re_verify_then_merge() -> None:
    assert gate.only_base_moved(gate.merge_gate(facts(branch_tip="d" * 40)))
    assert not gate.only_base_moved(gate.merge_gate(facts(branch_tip="d" * 40,
                                                          auto_merge=False)))
    assert not gate.only_base_moved(gate.merge_gate(facts()))


def test_an_empty_gate_never_passes() -> None:
    assert not gate.gate_passed([])


ERROR_FELL = gate.PerformanceResult("cp-error", "max_rel_error", "improved",
                                    "cp-error max_rel_error fell", "ratio 0.0000057",
                                    kind="error")


def test_an_error_that_fell_is_no_gain_to_confirm_end_to_end() -> None:
    checks = gate.merge_gate(facts(evidence=evidence(performance=(ERROR_FELL,))))

    end_to_end = next(c for c in checks if c.name == "end-to-end")
    assert end_to_end.passed and end_to_end.detail == "no performance gain is claimed"


def test_only_a_time_or_throughput_confirms_a_gain_end_to_end() -> None:
    fell_there = dataclasses.replace(ERROR_FELL, probe="e2e-serve")
    checks = gate.merge_gate(facts(evidence=evidence(performance=(MICRO, fell_there))))

    assert "did not report" in failing(checks)["end-to-end"]


def test_a_confirmed_gain_names_the_metric_that_confirms_it() -> None:
    end_to_end = next(c for c in gate.merge_gate(facts()) if c.name == "end-to-end")

    assert end_to_end.detail.startswith("e2e-serve (e2e, cost 100) improved on latency_ms: ")


def test_a_gain_that_is_not_credited_is_not_confirmed_end_to_end() -> None:
    cheat = dataclasses.replace(E2E, verdict=gate.NOT_CREDITED,
                                title="e2e-serve latency_ms not credited")
    checks = gate.merge_gate(facts(evidence=evidence(performance=(MICRO, cheat))))

    assert failing(checks)["end-to-end"] == (
        "no gain is credited: e2e-serve latency_ms not credited comes with an integrity "
        "failure, so its speed-up is not the change's")
