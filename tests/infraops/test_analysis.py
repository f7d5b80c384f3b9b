"""infraops.analysis: medians per (probe, variant, metric, case) and criteria verdicts."""

from __future__ import annotations

from typing import Any

import pytest

from infraops.analysis import (
    MetricComparison,
    SampleRow,
    compare_samples,
    evaluate_criterion,
    metric_value,
)


def rows(probe: str, side: str, values: list[float], *, metric: str = "latency_ms",
         variant: str = "", case: str = "", unit: str = "ms") -> list[SampleRow]:
    return [SampleRow(probe, side, variant, metric, v, unit, case) for v in values]


def comparison(
    baseline: float | None, candidate: float | None, *, variant: str = "",
    metric: str = "latency_ms", probe: str = "bench", case: str = "",
) -> MetricComparison:
    return MetricComparison(probe=probe, variant=variant, metric=metric, case=case, unit="ms",
                            baseline_median=baseline, candidate_median=candidate,
                            baseline_n=0 if baseline is None else 3,
                            candidate_n=0 if candidate is None else 3)


@pytest.mark.parametrize(("baseline", "candidate", "medians", "ratio"), [
    ([10.0, 12.0, 11.0], [8.0, 9.0, 100.0], (11.0, 9.0), 9.0 / 11.0),
    ([10.0, 20.0], [5.0, 6.0, 7.0, 8.0], (15.0, 6.5), 6.5 / 15.0),
    ([4.0], [4.0], (4.0, 4.0), 1.0),
    ([0.0, 0.0, 1.0], [3.0], (0.0, 3.0), None),  # a zero baseline has no ratio
])
def test_compare_samples_takes_each_sides_median(
    baseline: list[float], candidate: list[float], medians: tuple[float, float],
    ratio: float | None
) -> None:
    [result] = compare_samples(rows("bench", "baseline", baseline)
                               + rows("bench", "candidate", candidate))

    assert (result.baseline_median, result.candidate_median) == medians
    assert (result.baseline_n, result.candidate_n) == (len(baseline), len(candidate))
    assert result.ratio == (pytest.approx(ratio) if ratio is not None else None)
    assert result.unit == "ms"
    assert result.as_dict()["ratio"] == result.ratio


@pytest.mark.parametrize(("sides", "baseline_median", "candidate_median"), [
    ({"baseline": [1.0, 2.0, 3.0]}, 2.0, None),
    ({"candidate": [1.0, 2.0, 3.0]}, None, 2.0),
])
def test_a_side_without_samples_is_unmeasured_and_has_no_ratio(
    sides: dict[str, list[float]], baseline_median: float | None, candidate_median: float | None
) -> None:
    samples = [row for side, values in sides.items() for row in rows("bench", side, values)]

    [result] = compare_samples(samples)

    assert (result.baseline_median, result.candidate_median) == (baseline_median,
                                                                 candidate_median)
    assert result.ratio is None


def test_samples_are_grouped_by_probe_variant_metric_and_case_in_sorted_order() -> None:
    samples = [
        *rows("kda", "baseline", [3.0, 5.0], variant="cp=on", metric="max_err", case="len-4096"),
        *rows("kda", "candidate", [1.0], variant="cp=on", metric="max_err", case="len-4096"),
        *rows("kda", "baseline", [2.0], variant="cp=off", metric="max_err", case="len-4096"),
        *rows("kda", "baseline", [7.0], variant="cp=on", metric="max_err", case="len-1024"),
        *rows("bench", "candidate", [9.0], unit="tok/s", metric="tokens_per_s"),
    ]

    result = compare_samples(samples)

    assert [(c.probe, c.variant, c.metric, c.case) for c in result] == [
        ("bench", "", "tokens_per_s", ""),
        ("kda", "cp=off", "max_err", "len-4096"),
        ("kda", "cp=on", "max_err", "len-1024"),
        ("kda", "cp=on", "max_err", "len-4096"),
    ]
    last = result[-1]
    assert (last.baseline_median, last.candidate_median, last.baseline_n) == (4.0, 1.0, 2)
    assert result[0].unit == "tok/s"


def test_metric_value_is_the_median_of_the_case_medians() -> None:
    comparisons = [comparison(10.0, 1.0, case="a"), comparison(20.0, 2.0, case="b"),
                   comparison(None, 9.0, case="c"), comparison(30.0, None, case="d")]

    assert metric_value(comparisons, probe="bench", metric="latency_ms", variant="",
                        side="candidate") == 2.0
    assert metric_value(comparisons, probe="bench", metric="latency_ms", variant="",
                        side="baseline") == 20.0
    assert metric_value(comparisons, probe="bench", metric="other", variant="",
                        side="baseline") is None


def spec(kind: str, comparison_: str, value: float, **extra: Any) -> dict[str, Any]:
    return {"kind": kind, "probe": "bench", "metric": "latency_ms", "comparison": comparison_,
            "value": value, "description": f"{kind} {comparison_} {value}", **extra}


@pytest.mark.parametrize(("criterion", "comparisons", "quantity", "passed", "detail"), [
    # threshold: the candidate's value itself
    (spec("threshold", "<=", 10.0), [comparison(20.0, 9.5)], 9.5, True, "candidate 9.5"),
    (spec("threshold", "<=", 10.0), [comparison(20.0, 10.5)], 10.5, False, "candidate 10.5"),
    (spec("threshold", ">=", 100.0), [comparison(1.0, 100.0)], 100.0, True, "candidate 100"),
    # relative: candidate / baseline - 1
    (spec("relative", "<=", -0.05), [comparison(10.0, 9.0)], -0.1, True,
     "candidate vs baseline -10.00%"),
    (spec("relative", "<=", -0.05), [comparison(10.0, 9.8)], -0.02, False,
     "candidate vs baseline -2.00%"),
    (spec("relative", ">=", 0.1), [comparison(100.0, 125.0)], 0.25, True,
     "candidate vs baseline +25.00%"),
    # relation: candidate at variant / candidate at reference_variant - 1
    (spec("relation", "<=", 0.05, variant="kv=on", reference_variant="kv=off"),
     [comparison(1.0, 10.4, variant="kv=on"), comparison(1.0, 10.0, variant="kv=off")],
     0.04, True, "scenario gap +4.00%"),
    (spec("relation", "<=", 0.05, variant="kv=on", reference_variant="kv=off"),
     [comparison(1.0, 12.0, variant="kv=on"), comparison(1.0, 10.0, variant="kv=off")],
     0.2, False, "scenario gap +20.00%"),
])
def test_evaluate_criterion_by_kind(
    criterion: dict[str, Any], comparisons: list[MetricComparison], quantity: float,
    passed: bool, detail: str
) -> None:
    verdict = evaluate_criterion(criterion, comparisons)

    assert verdict.quantity == pytest.approx(quantity)
    assert verdict.passed is passed
    assert verdict.detail == detail
    assert verdict.criterion == criterion["description"]


def test_the_bound_itself_passes_both_ways() -> None:
    at_bound = [comparison(10.0, 10.0)]

    assert evaluate_criterion(spec("threshold", "<=", 10.0), at_bound).passed
    assert evaluate_criterion(spec("threshold", ">=", 10.0), at_bound).passed


def test_the_variant_of_a_spec_is_matched_whatever_its_order_and_spaces() -> None:
    comparisons = [comparison(10.0, 8.0, variant="cp=on,precision=tf32x3"),
                   comparison(10.0, 30.0, variant="")]
    criterion = spec("relative", "<=", 0.0, variant=" precision = tf32x3 , cp=on")

    verdict = evaluate_criterion(criterion, comparisons)

    assert verdict.quantity == pytest.approx(-0.2)
    assert verdict.passed


@pytest.mark.parametrize(("criterion", "comparisons"), [
    (spec("threshold", "<=", 10.0), []),
    (spec("threshold", "<=", 10.0), [comparison(10.0, None)]),
    (spec("threshold", "<=", 10.0), [comparison(10.0, 5.0, metric="other")]),
    (spec("relative", "<=", 0.0), [comparison(None, 5.0)]),
    (spec("relative", "<=", 0.0), [comparison(10.0, None)]),
    (spec("relative", ">=", -1.0), [comparison(0.0, 5.0)]),  # baseline 0: no ratio
    (spec("relative", "<=", 0.0, variant="cp=off"), [comparison(10.0, 5.0, variant="cp=on")]),
    (spec("relation", "<=", 0.05, variant="kv=on", reference_variant="kv=off"),
     [comparison(1.0, 10.0, variant="kv=on")]),
    (spec("relation", "<=", 0.05, variant="kv=on", reference_variant="kv=off"),
     [comparison(1.0, 10.0, variant="kv=on"), comparison(1.0, 0.0, variant="kv=off")]),
])
def test_an_unmeasured_criterion_fails(criterion: dict[str, Any],
                                       comparisons: list[MetricComparison]) -> None:
    verdict = evaluate_criterion(criterion, comparisons)

    assert verdict.passed is False
    assert verdict.quantity is None
    assert "unmeasured" in verdict.detail


def test_a_blank_variant_covers_every_variant_of_the_probe() -> None:
    comparisons = [comparison(10.0, 9.0, variant="cp=off"), comparison(10.0, 9.0, variant="cp=on")]

    verdict = evaluate_criterion(spec("relative", "<=", 0.0, variant=""), comparisons)

    assert verdict.quantity == pytest.approx(-0.1)
    assert verdict.passed


def test_a_verdict_without_a_description_names_probe_and_metric() -> None:
    criterion = spec("threshold", "<=", 1.0)
    del criterion["description"]

    verdict = evaluate_criterion(criterion, [])

    assert verdict.criterion == "bench.latency_ms"
    assert verdict.as_dict() == {"criterion": "bench.latency_ms", "passed": False,
                                 "quantity": None,
                                 "detail": "unmeasured: no samples for this criterion"}
