"""infraops/feedback.py and the interval criteria of infraops/analysis.py: ordering, the
bound on the agent's text, and criteria that pass only with confidence."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from infraops import feedback
from infraops.analysis import evaluate_criterion_ci
from infraops.feedback import Finding


def finding(severity: str, specificity: int, title: str = "t", detail: str = "d") -> Finding:
    return Finding("performance", "k", severity, title, detail, specificity)


def test_findings_are_ordered_by_severity_then_most_specific_first() -> None:
    built = feedback.build([
        finding("info", feedback.CASE, "note"), finding("fail", feedback.METRIC, "metric"),
        finding("fail", feedback.ELEMENT, "element"), finding("warn", feedback.SPAN, "span"),
        finding("pass", feedback.ELEMENT, "ok"),
    ])
    assert [f.title for f in built.findings] == ["element", "metric", "span", "note", "ok"]
    assert built.counts == {"fail": 2, "warn": 1, "info": 1, "pass": 1}


@pytest.mark.parametrize("count", [0, 1, 10, 500])
def test_the_agent_text_stays_within_its_bound_and_counts_what_it_left_out(count: int) -> None:
    built = feedback.build(finding("fail", feedback.CASE, f"case {i}", "x" * 300)
                           for i in range(count))
    text = built.agent_text()

    assert len(text) <= feedback.AGENT_TEXT_LIMIT
    assert text.startswith(f"Feedback: {count} failing")
    shown = text.count("[FAIL performance]")
    if shown < count:
        assert f"({count - shown} more findings on the experiment page)" in text
    else:
        assert "more findings" not in text


def test_a_single_huge_finding_is_cut_not_allowed_to_blow_the_bound() -> None:
    text = feedback.build([finding("fail", 1, "big", "y" * 100_000)]).agent_text(limit=500)
    assert len(text) <= 500


def criterion(kind: str, comparison: str, value: float, **extra: str) -> dict[str, Any]:
    return {"kind": kind, "probe": "p", "metric": "m", "comparison": comparison,
            "value": value, "variant": extra.get("variant", ""),
            "reference_variant": extra.get("reference_variant", ""), "description": kind}


def sampler(table: dict[tuple[str, str], list[float]]):  # type: ignore[no-untyped-def]
    return lambda variant, side: table.get((variant, side), [])


RNG = np.random.default_rng(7)
BASE = list(100 + RNG.normal(0, 2, 12))
FASTER = [v * 0.8 for v in BASE]


@pytest.mark.parametrize(("spec", "table", "passed", "phrase"), [
    (criterion("threshold", "<=", 110), {("", "candidate"): BASE}, True, "with 95% confidence"),
    (criterion("threshold", "<=", 100.5), {("", "candidate"): BASE}, False, "not established"),
    (criterion("threshold", "<=", 90), {("", "candidate"): BASE}, False, "misses"),
    (criterion("relative", "<=", -0.1), {("", "baseline"): BASE, ("", "candidate"): FASTER},
     True, "candidate vs baseline -20"),
    (criterion("relative", "<=", -0.3), {("", "baseline"): BASE, ("", "candidate"): FASTER},
     False, "misses"),
    (criterion("relation", "<=", 0.05, variant="kv=on", reference_variant="kv=off"),
     {("kv=off", "candidate"): FASTER, ("kv=on", "candidate"): BASE}, False, "scenario gap +25"),
    (criterion("relation", "<=", 0.30, variant="kv=on", reference_variant="kv=off"),
     {("kv=off", "candidate"): FASTER, ("kv=on", "candidate"): BASE}, True, "scenario gap"),
    (criterion("relative", "<=", 0.0), {("", "baseline"): BASE[:2], ("", "candidate"): BASE},
     False, "unmeasured"),
    (criterion("threshold", ">=", 1), {}, False, "unmeasured"),
])
def test_criteria_pass_only_when_the_whole_interval_meets_the_bound(
    spec: dict[str, Any], table: dict[tuple[str, str], list[float]], passed: bool, phrase: str,
) -> None:
    verdict = evaluate_criterion_ci(spec, sampler(table))

    assert verdict.passed is passed
    assert phrase in verdict.detail
    if verdict.quantity is not None:
        assert verdict.ci_low is not None and verdict.ci_high is not None
        assert verdict.ci_low <= verdict.quantity <= verdict.ci_high
