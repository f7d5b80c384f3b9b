"""Samples as the analyses see them: one row per reported value, reduced to one value per
execution, and the medians table of an experiment. Pure: no Django.

Executions are the independent, interleaved units; samples within one process share its state
(caches, frequency, placement), so the findings and the medians table both use one value per
execution (the median of what it reported) and show the same n.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class SampleRow:
    probe: str
    side: str  # "baseline" | "candidate"
    variant: str  # canonical "k=v,k2=v2"; "" for the default
    metric: str
    value: float
    unit: str = ""
    case: str = ""
    execution: int = 0  # the ProbeExecution that reported it (0: not known)


@dataclass(frozen=True)
class MetricComparison:
    probe: str
    variant: str
    metric: str
    case: str
    unit: str
    baseline_median: float | None
    candidate_median: float | None
    baseline_n: int
    candidate_n: int

    @property
    def ratio(self) -> float | None:
        """candidate / baseline; None when either side is unmeasured or the baseline is 0."""
        if not self.baseline_median or self.candidate_median is None:
            return None
        return self.candidate_median / self.baseline_median

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"ratio": self.ratio}


def compare_samples(rows: Iterable[SampleRow]) -> list[MetricComparison]:
    """Group samples by (probe, variant, metric, case) and compare the sides' medians (pass
    `per_execution_rows(rows)` for the table the findings agree with)."""
    groups: dict[tuple[str, str, str, str], dict[str, list[float]]] = defaultdict(
        lambda: {"baseline": [], "candidate": []}
    )
    units: dict[tuple[str, str, str, str], str] = {}
    for row in rows:
        key = (row.probe, row.variant, row.metric, row.case)
        groups[key][row.side].append(row.value)
        units.setdefault(key, row.unit)
    result = []
    for key in sorted(groups):
        sides = groups[key]
        result.append(
            MetricComparison(
                probe=key[0], variant=key[1], metric=key[2], case=key[3], unit=units[key],
                baseline_median=_median(sides["baseline"]),
                candidate_median=_median(sides["candidate"]),
                baseline_n=len(sides["baseline"]), candidate_n=len(sides["candidate"]),
            )
        )
    return result


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None




SampleKey = tuple[str, str, str, str, str]  # probe, variant, metric, case, side


def per_execution(rows: Iterable[SampleRow]) -> dict[SampleKey, list[float]]:
    """One value per execution and key: the median of what that execution reported, in run
    order (execution ids grow as executions are recorded): the sequential comparison reads
    the first n of a side at each look, and a side's first execution may be a first-run
    outlier (infraops.feedback.stats.sequential_compare).

    Pooling the samples of one process would understate the noise. Seen here: an A/A run
    pooled 90 per-step samples a side into a 'regression' at p = 3e-6.
    """
    per_run: dict[tuple[int, SampleKey], list[float]] = defaultdict(list)
    units: dict[SampleKey, str] = {}
    for row in rows:
        key = (row.probe, row.variant, row.metric, row.case, row.side)
        per_run[(row.execution, key)].append(row.value)
        units.setdefault(key, row.unit)
    grouped: dict[SampleKey, list[float]] = defaultdict(list)
    for (_, key), values in sorted(per_run.items(), key=lambda item: item[0][0]):
        grouped[key].append(float(np.median(values)))
    return grouped


def per_execution_rows(rows: Sequence[SampleRow]) -> list[SampleRow]:
    """`per_execution` as rows (one per execution and key), units kept."""
    units = {(r.probe, r.variant, r.metric, r.case, r.side): r.unit for r in rows}
    return [SampleRow(probe=key[0], side=key[4], variant=key[1], metric=key[2], value=value,
                      unit=units.get(key, ""), case=key[3])
            for key, values in per_execution(rows).items() for value in values]
