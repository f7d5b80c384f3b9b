"""infraops.feedback.samples: one value per execution, and the medians per (probe, variant, metric,
case) that the experiment page shows."""

from __future__ import annotations

import pytest

from infraops.feedback.samples import SampleRow, compare_samples, per_execution, per_execution_rows


def rows(probe: str, side: str, values: list[float], *, metric: str = "latency_ms",
         variant: str = "", case: str = "", unit: str = "ms") -> list[SampleRow]:
    return [SampleRow(probe, side, variant, metric, v, unit, case) for v in values]


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


def test_one_value_per_execution_feeds_the_table_so_it_shows_the_findings_n() -> None:
    # Two executions a side, each reporting three per-step samples: n is 2, not 6.
    samples = [SampleRow("bench", side, "", "step_ms", v, "ms", "", execution)
               for side, execution, values in (("baseline", 1, [10.0, 11.0, 30.0]),
                                               ("baseline", 2, [12.0, 12.0, 12.0]),
                                               ("candidate", 3, [9.0, 9.0, 9.0]),
                                               ("candidate", 4, [8.0, 7.0, 9.0]))
               for v in values]

    assert per_execution(samples)[("bench", "", "step_ms", "", "baseline")] == [11.0, 12.0]
    [table] = compare_samples(per_execution_rows(samples))

    assert (table.baseline_n, table.candidate_n) == (2, 2)
    assert (table.baseline_median, table.candidate_median) == (11.5, 8.5)
    assert table.unit == "ms"
