"""infraops/feedback/findings.py and the interval criteria of infraops/feedback/criteria.py:
ordering, the
bound on the agent's text, and criteria that pass only with confidence."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from infraops.feedback import findings as feedback
from infraops.feedback.criteria import evaluate_criterion_ci
from infraops.feedback.findings import Finding


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
    assert text.startswith(f"Verdict: {count} failing" if count else "Verdict: nothing to judge")
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


# --- issue 10: names, explanations, execution apart from verdict, next steps ----------------

def test_a_criterion_is_called_by_its_name_and_its_condition_kept() -> None:
    spec = criterion("relative", "<=", -0.05) | {"name": "decode 5% faster"}
    values = sampler({("", "baseline"): [10.0, 10.1, 9.9, 10.0, 10.2],
                      ("", "candidate"): [9.0, 9.1, 8.9, 9.0, 9.2]})
    verdict = evaluate_criterion_ci(spec, values)
    assert verdict.criterion == "decode 5% faster"
    assert evaluate_criterion_ci({k: v for k, v in spec.items() if k != "name"},
                                 values).criterion == spec["description"]


@pytest.mark.parametrize(("baseline", "candidate", "verdict", "words"), [
    ([100.0] * 5, [102.0] * 5, "regressed", "regressed: ratio 1.02"),
    ([100.0, 100.01, 99.99, 100.0, 100.02], [100.1, 100.11, 100.09, 100.1, 100.12], "no change",
     "no change: ratio"),
    ([100.0, 100.1, 100.2], [103.0, 103.1, 103.2], "inconclusive",
     "inconclusive because ratio"),
])
def test_every_performance_verdict_explains_itself(baseline: list[float],
                                                   candidate: list[float], verdict: str,
                                                   words: str) -> None:
    from infraops.feedback.stats import compare

    [f] = feedback.performance_findings("bench", "", "instructions", "", "",
                                        compare(baseline, candidate), {})
    assert f.title == f"bench instructions {verdict}"
    assert f.detail.startswith(words), f.detail
    assert "n=" in f.detail and "executions a side" in f.detail
    if verdict == "inconclusive":
        assert "cannot reach p < 0.01 with fewer than 5 repeats a side" in f.detail
    if verdict == "no change":
        assert "within +-1.00% of 1, the smallest meaningful effect" in f.detail


@pytest.mark.parametrize(("ratio", "direction", "implausible"), [
    (0.1, "minimize", True), (0.25, "minimize", False), (10.0, "maximize", True),
    (10.0, "minimize", False),  # a 10x slow-down is a regression, not a cheat
])
def test_a_speed_up_beyond_the_bound_fails_as_implausible(ratio: float, direction: str,
                                                          implausible: bool) -> None:
    from infraops.feedback.stats import compare

    result = compare([10.0, 10.1, 9.9, 10.0, 10.05], [10.0 * ratio] * 5, direction=direction)
    found = feedback.performance_findings("bench", "", "ms", "", "", result, {}, plausible=5.0)
    flagged = [f for f in found if f.kind == "too-good-to-be-true"]
    assert bool(flagged) is implausible
    assert all(f.severity == feedback.FAIL and f.layer == "integrity" for f in flagged)


@pytest.mark.parametrize(("kind", "ratio", "severity", "word", "implausible"), [
    ("time", 1e-5, feedback.PASS, "improved", True),
    ("error", 1e-5, feedback.PASS, "fell", False),  # a precision fix, never a cheat
    ("error", 3.0, feedback.WARN, "grew", False),
    ("memory", 1.5, feedback.WARN, "regressed", False),
    ("count", 2.4, feedback.INFO, "changed", False),  # more registers: a fact, not slower
    ("count", 1e-5, feedback.INFO, "changed", False),
    ("ratio", 0.5, feedback.INFO, "changed", False),
    ("time", 3.0, feedback.FAIL, "regressed", False),
], ids=lambda value: str(value))
def test_a_verdict_reads_as_the_kind_of_its_metric(kind: str, ratio: float, severity: str,
                                                    word: str, implausible: bool) -> None:
    from infraops.feedback.stats import compare

    result = compare([10.0, 10.1, 9.9, 10.0, 10.05], [10.0 * ratio] * 5)
    found = feedback.performance_findings("bench", "", "m", "", "", result, {}, kind=kind)
    assert (found[0].severity, found[0].title) == (severity, f"bench m {word}")
    assert found[0].evidence["kind"] == kind
    assert any(f.kind == "too-good-to-be-true" for f in found) is implausible
    assert ("not a speed" in found[0].detail) is (kind not in ("time", "throughput"))


def test_a_candidate_failing_an_integrity_check_is_credited_no_improvement() -> None:
    from infraops.feedback.stats import compare

    faster = feedback.performance_findings(
        "bench", "", "ms", "", "", compare([10.0, 10.1, 9.9, 10.0, 10.05], [4.0] * 5),
        {"probe": "bench"})
    cheat = Finding("integrity", "left-behind", feedback.FAIL, "left 2 files", "d",
                    feedback.PROBE, {"side": "candidate"})
    on_the_baseline = Finding("integrity", "degenerate-output", feedback.FAIL, "zeros", "d",
                              feedback.CASE, {"compared": "candidate vs baseline (baseline)"})

    assert feedback.uncredited([*faster, on_the_baseline]) == [*faster, on_the_baseline]
    [judged, _] = feedback.uncredited([*faster, cheat])
    assert (judged.severity, judged.title) == (feedback.WARN, "bench ms not credited")
    assert judged.detail.startswith("not credited: the candidate fails 1 integrity check "
                                    "(first: left 2 files). improved: ")
    assert judged.evidence["credited"] is False
    assert judged.evidence["comparison"]["verdict"] == "improved"


def test_what_ran_is_worded_apart_from_the_verdict() -> None:
    built = feedback.build([finding("fail", feedback.CASE, "a"), finding("fail", feedback.CASE)],
                           execution={"text": "all probes ran: 12 executions, exit 0"})
    text = built.agent_text()
    assert text.startswith("Execution: all probes ran: 12 executions, exit 0.\nVerdict: 2 failing")
    assert built.as_dict()["verdict"] == "2 failing, 0 warnings"


def next_finding(kind: str, layer: str, **evidence: Any) -> Finding:
    return Finding(layer, kind, feedback.FAIL, f"t {kind}", "d", feedback.CASE, evidence)


@pytest.mark.parametrize(("found", "probes", "steps"), [
    ([next_finding("probe-failed", "execution", probe="p", side="candidate", variant="cp=on",
                   reason="timeout")], [],
     ["read the stderr of p candidate [cp=on] above (reason timeout)"]),
    ([next_finding("output-mismatch", "correctness", probe="p", case="len-4096",
                   compared="[cp=on] vs [cp=off] (candidate)", seeds=[7],
                   variants=["cp=off", "cp=on"],
                   comparison={"first_mismatch": [0, 3, 17]})], [],
     ["read case len-4096 of p [cp=on] vs [cp=off] (candidate) first at index [0, 3, 17] "
      "(INFRAOPS_SEED=7 reproduces it)",
      "compare variants [cp=on] and [cp=off] of p case by case: they must agree"]),
    ([Finding("performance", "perf-comparison", feedback.WARN, "t", "d", feedback.METRIC,
              {"probe": "bench", "metric": "ms", "variant": "",
               "comparison": {"verdict": "inconclusive", "repeats_needed": 8,
                              "advice": "with this noise (CV 3.0%), 8 repeats a side would "
                                        "detect the observed 5.0% effect"}})],
     [("e2e", 5, "covers the change (e2e) and has not run on it")],
     ["decide bench ms: with this noise (CV 3.0%), 8 repeats a side would detect the observed "
      "5.0% effect", "run probe e2e next (cost 5): covers the change (e2e) and has not run on "
      "it"]),
])
def test_next_steps_follow_from_the_findings(found: list[Finding],
                                             probes: list[tuple[str, int, str]],
                                             steps: list[str]) -> None:
    result = feedback.next_steps(found, probes)
    assert len(result) == len(steps)
    for step, expected in zip(result, steps, strict=True):
        assert step.startswith(expected), step


def test_next_steps_are_deduplicated_bounded_and_kept_in_the_agent_text() -> None:
    same = [next_finding("output-mismatch", "correctness", probe="p", case="c1", compared="x",
                         seeds=[1]) for _ in range(5)]
    many = [next_finding("output-mismatch", "correctness", probe="p", case=f"c{i}",
                         compared=f"pair {i}") for i in range(20)]
    one_pair = [next_finding("output-mismatch", "correctness", probe="p", case=f"c{i}",
                             compared="pair") for i in range(20)]
    assert len(feedback.next_steps(same)) == 1
    assert len(feedback.next_steps(one_pair)) == 1  # one case to read first per pair
    assert len(feedback.next_steps(many)) == feedback.MAX_NEXT_STEPS
    # The probe to run next keeps its slot however many cases failed.
    steps = feedback.next_steps(many, [("e2e", 9, "covers the change")])
    assert len(steps) == feedback.MAX_NEXT_STEPS and steps[-1].startswith("run probe e2e")
    built = feedback.build(many + [finding("fail", feedback.CASE, "x", "y" * 900)
                                   for _ in range(30)])
    text = built.agent_text()
    assert len(text) <= feedback.AGENT_TEXT_LIMIT
    assert text.rstrip().splitlines()[-1].startswith(f"{feedback.MAX_NEXT_STEPS}. read case")


def test_a_crash_keeps_the_end_of_its_stderr_in_the_agent_text() -> None:
    tail = "\n".join(f'  File "engine/kv.py", line {i}, in step' for i in range(40))[-1400:]
    crash = Finding("execution", "probe-failed", feedback.FAIL, "p candidate [] #0 failed",
                    f"exit status 1, reason exit; the last lines of its stderr:\n{tail}\n"
                    "ValueError: shapes (17,) and (16,) differ", feedback.PROBE, {})
    text = feedback.build([crash]).agent_text()
    assert "ValueError: shapes (17,) and (16,) differ" in text


def test_the_next_step_points_at_the_worst_case_of_a_pair() -> None:
    cases = [("n64", 1e-6, [0]), ("n4096", 0.5, None), ("n256", 2e-3, [3])]
    found = [Finding("correctness", "output-mismatch", feedback.FAIL, f"bench case {case}", "d",
                     feedback.ELEMENT if index else feedback.CASE,
                     {"probe": "decode_bench", "compared": "", "case": case,
                      "comparison": {"max_abs_error": error, "first_mismatch": index}})
             for case, error, index in cases]

    steps = feedback.build(found).next_steps

    assert steps[0] == "read case n4096 of decode_bench first"


def test_a_speed_up_beyond_the_bound_only_in_its_noise_warns_and_fails_nothing() -> None:
    """The showcase's merged tiles (3.5x on a quiet machine) measured 5.6x while four runs
    shared two cores, with an interval reaching down to 2.1x: that is noise, not a cheat, and
    it no longer fails integrity (nor uncredits the instruction counts beside it)."""
    from infraops.feedback.stats import compare

    baseline = [331.0, 210.0, 480.0, 300.0, 350.0, 190.0]
    candidate = [59.0, 40.0, 120.0, 61.0, 55.0, 180.0]
    result = compare(baseline, candidate)
    assert 1 / result.ratio > 5 and 1 / result.ci_high < 5, result
    found = feedback.performance_findings("bench", "", "ms", "", "", result, {}, plausible=5.0)

    assert not [f for f in found if f.severity == feedback.FAIL]
    [warned] = [f for f in found if f.layer == "integrity"]
    assert warned.severity == feedback.WARN
    assert "beyond the plausibility bound, within the noise" in warned.title
    assert "interval reaches down to" in warned.detail


def test_a_speed_up_whose_whole_interval_is_beyond_the_bound_fails_and_says_how_sure() -> None:
    from infraops.feedback.stats import compare

    result = compare([100.0, 101.0, 99.0, 100.5, 99.5, 100.2],
                     [15.0, 15.2, 14.9, 15.1, 15.0, 15.05])
    found = feedback.performance_findings("bench", "", "ms", "", "", result, {}, plausible=5.0)

    [cheat] = [f for f in found if f.kind == "too-good-to-be-true"]
    assert cheat.severity == feedback.FAIL and cheat.title == "bench ms 6.66x better: implausible"
    assert "(at least 6.59x with 95% confidence)" in cheat.detail


# --- one finding per root cause (issue 26, item 5) -------------------------------------------

def mismatch(case: str, max_abs: float, size: int) -> Any:
    from infraops.feedback.correctness import CaseComparison

    return CaseComparison(case, "mismatch", (256,), "float32", max_abs, max_abs * 10, 5000,
                          200, (0, 0, 0), (1.0, 1.0 + max_abs), float(size),
                          f"case {case}: 200 of 256 elements differ; max abs {max_abs:g}")


def test_one_cause_failing_every_case_is_one_finding_with_its_cases_worst_first() -> None:
    from infraops.feedback.correctness import ErrorSeries

    # A TF32 merge: every length fails its rule, and the error grows with the length.
    errors = {"len-64": 0.00845, "len-256": 0.0157, "len-1024": 0.0289, "len-4096": 0.0516}
    evidence = {"probe": "cp-check", "compared": "[cp=on] vs [cp=off] (candidate)"}
    cases = feedback.correctness_findings(
        "cp-check", evidence["compared"],
        [mismatch(case, error, int(case[4:])) for case, error in errors.items()], evidence)
    series = ErrorSeries(((64.0, 0.00845), (4096.0, 0.0516)), 0.44, True,
                         "max absolute error grows with size: 0.00845 at 64 to 0.0516 at 4096",
                         "max_abs_error")
    grows = feedback.series_finding("cp-check", evidence["compared"], series, evidence)
    assert grows is not None and len(cases) == 4
    other = Finding("correctness", "output-mismatch", feedback.FAIL, "cp-check other case x",
                    "d", feedback.CASE, {"probe": "cp-check", "compared": "other", "case": "x"})

    built = feedback.build(feedback.by_root_cause([*cases, grows, other]))

    assert built.counts[feedback.FAIL] == 2, [f.title for f in built.findings]
    [cause] = [f for f in built.findings if f.evidence["compared"] == evidence["compared"]]
    assert cause.title == ("cp-check [cp=on] vs [cp=off] (candidate) cases len-4096, len-1024, "
                           "len-256, len-64 mismatch")
    assert cause.detail.startswith("case len-4096: 200 of 256 elements differ")
    assert ("also 3 more cases, worst first: len-1024 (max abs 0.0289, 200 elements differ), "
            "len-256 (max abs 0.0157, 200 elements differ), len-64") in cause.detail
    assert cause.detail.endswith("; max absolute error grows with size: 0.00845 at 64 to "
                                 "0.0516 at 4096")
    assert cause.evidence["case"] == "len-4096" and cause.evidence["series"]["growing"]
    assert cause.evidence["cases"] == ["len-4096", "len-1024", "len-256", "len-64"]
    assert cause.evidence["comparisons"]["len-64"]["max_abs_error"] == 0.00845
    assert built.next_steps[0].startswith(
        "read case len-4096 of cp-check [cp=on] vs [cp=off] (candidate) first")
    # The finding about another pair keeps its place and its words.
    assert other in built.findings


def test_a_growing_error_whose_cases_pass_stays_a_finding_of_its_own() -> None:
    from infraops.feedback.correctness import ErrorSeries

    evidence = {"probe": "p", "compared": "candidate vs baseline [default]"}
    series = ErrorSeries(((64.0, 1e-6), (4096.0, 1e-5)), 0.5, True, "grows", "max_abs_error")
    watch = feedback.series_finding("p", evidence["compared"], series, evidence,
                                    severity=feedback.WARN)
    one = feedback.correctness_findings("p", "other pair", [mismatch("n1", 0.1, 1)],
                                        {"probe": "p", "compared": "other pair"})
    assert watch is not None

    assert feedback.by_root_cause([watch, *one]) == [watch, *one]


def test_a_finding_of_several_cases_gives_back_the_title_of_each() -> None:
    evidence = {"probe": "p", "compared": "x"}
    cases = feedback.correctness_findings(
        "p", "x", [mismatch(f"c{n}", n / 10, n) for n in range(1, 9)], evidence)
    [cause] = feedback.by_root_cause(cases)

    assert cause.title == "p x cases c8, c7, c6, c5, c4, c3 and 2 more mismatch"
    assert feedback.case_titles(cause.as_dict()) == [f"p x case c{n} mismatch"
                                                     for n in range(8, 0, -1)]
    assert feedback.case_titles(cases[0].as_dict()) == ["p x case c1 mismatch"]
