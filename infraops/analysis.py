"""Comparisons of candidate and baseline samples, and criteria verdicts. Pure: no Django.

This is the thin first layer of the feedback: medians and their ratio per (probe, variant,
metric, case). Confidence intervals and rank tests extend it (see docs/feedback.md).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

# What identifies a criterion as measured; the merge gate matches these to the pinned version.
CRITERION_KEYS = ("kind", "probe", "metric", "variant", "reference_variant", "comparison",
                  "value")


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
    """Group samples by (probe, variant, metric, case) and compare the sides' medians."""
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


@dataclass(frozen=True)
class Verdict:
    criterion: str
    passed: bool
    quantity: float | None
    detail: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def metric_value(
    comparisons: Sequence[MetricComparison], *, probe: str, metric: str, variant: str, side: str
) -> float | None:
    """The median of one metric at one variant and side, over all cases (median of medians);
    a blank variant means every variant of the probe."""
    values = [
        (c.candidate_median if side == "candidate" else c.baseline_median)
        for c in comparisons
        if c.probe == probe and c.metric == metric and variant in ("", c.variant)
    ]
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def evaluate_criterion(spec: dict[str, Any], comparisons: Sequence[MetricComparison]) -> Verdict:
    """A criterion spec (see AcceptanceCriterion.as_spec) against compared samples.

    Unmeasured means failed: a criterion whose numbers are missing never passes.
    """
    probe, metric, kind = spec["probe"], spec["metric"], spec["kind"]
    variant = _canonical(spec.get("variant", ""))
    description = spec.get("description", f"{probe}.{metric}")
    candidate = metric_value(comparisons, probe=probe, metric=metric, variant=variant,
                             side="candidate")
    if kind == "threshold":
        quantity = candidate
        shown = "candidate {q:g}"
    elif kind == "relative":
        baseline = metric_value(comparisons, probe=probe, metric=metric, variant=variant,
                                side="baseline")
        quantity = candidate / baseline - 1 if candidate is not None and baseline else None
        shown = "candidate vs baseline {q:+.2%}"
    else:
        reference = metric_value(comparisons, probe=probe, metric=metric,
                                 variant=_canonical(spec.get("reference_variant", "")),
                                 side="candidate")
        quantity = candidate / reference - 1 if candidate is not None and reference else None
        shown = "scenario gap {q:+.2%}"
    if quantity is None:
        return Verdict(description, False, None, "unmeasured: no samples for this criterion")
    bound = float(spec["value"])
    passed = quantity <= bound if spec["comparison"] == "<=" else quantity >= bound
    return Verdict(description, passed, quantity, shown.format(q=quantity))


def _canonical(variant: str) -> str:
    pairs = [p.strip() for p in variant.split(",") if p.strip()]
    split = (p.partition("=") for p in pairs)
    return ",".join(sorted(f"{k.strip()}={v.strip()}" for k, _, v in split))


@dataclass(frozen=True)
class IntervalVerdict:
    """A criterion judged with a 95% confidence interval of its quantity: it passes only when
    the whole interval meets the bound; unmeasured or straddling means failed."""

    criterion: str
    passed: bool
    quantity: float | None
    ci_low: float | None
    ci_high: float | None
    detail: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


Values = Callable[[str, str], list[float]]  # (variant, side) -> samples of the criterion's metric


def evaluate_criterion_ci(spec: dict[str, Any], values: Values, *, seed: int = 0
                          ) -> IntervalVerdict:
    """Judge one criterion spec (see AcceptanceCriterion.as_spec) on raw samples.

    threshold: the candidate median with a bootstrap 95% CI; relative: candidate/baseline - 1
    from stats.compare; relation: scenario/reference - 1 on the candidate, from stats.compare.
    """
    from infraops import stats

    description = spec.get("description", f"{spec['probe']}.{spec['metric']}")
    variant = _canonical(spec.get("variant", ""))
    kind = spec["kind"]
    candidate = values(variant, "candidate")
    if kind == "threshold":
        reference: list[float] = []
    elif kind == "relative":
        reference = values(variant, "baseline")
    else:
        reference = values(_canonical(spec.get("reference_variant", "")), "candidate")
    needed = [candidate] if kind == "threshold" else [candidate, reference]
    if any(len(v) < stats.MIN_SAMPLES for v in needed):
        counts = "/".join(str(len(v)) for v in needed)
        return IntervalVerdict(description, False, None, None, None,
                               f"unmeasured: {counts} samples, at least {stats.MIN_SAMPLES} "
                               "a side are needed")
    if kind == "threshold":
        quantity, low, high = _median_interval(candidate, seed=seed)
        shown = "candidate median {q:.4g} (95% CI {lo:.4g} to {hi:.4g})"
    else:
        result = stats.compare(reference, candidate, seed=seed)
        quantity, low, high = result.ratio - 1, result.ci_low - 1, result.ci_high - 1
        shown = ("candidate vs baseline {q:+.2%} (95% CI {lo:+.2%} to {hi:+.2%})"
                 if kind == "relative" else
                 "scenario gap {q:+.2%} (95% CI {lo:+.2%} to {hi:+.2%})")
    bound = float(spec["value"])
    at_most = spec["comparison"] == "<="
    passed = high <= bound if at_most else low >= bound
    meets = quantity <= bound if at_most else quantity >= bound
    text = shown.format(q=quantity, lo=low, hi=high)
    if passed:
        text += f": within {spec['comparison']} {bound:g} with 95% confidence"
    elif meets:
        text += f": the point estimate meets {spec['comparison']} {bound:g} but the interval " \
                "does not, so it is not established (more repeats narrow it)"
    else:
        text += f": misses {spec['comparison']} {bound:g}"
    return IntervalVerdict(description, passed, quantity, low, high, text)


def _median_interval(values: Sequence[float], *, seed: int, resamples: int = 2000
                     ) -> tuple[float, float, float]:
    import numpy as np

    data = np.asarray(values, dtype=float)
    rng = np.random.default_rng(seed)
    medians = np.median(rng.choice(data, size=(resamples, data.size), replace=True), axis=1)
    low, high = np.percentile(medians, [2.5, 97.5])
    return float(np.median(data)), float(low), float(high)
