"""Acceptance criteria judged on an experiment's samples, with 95% intervals. Pure: no Django.

A criterion spec is AcceptanceCriterion.as_spec(): kind (threshold, relative, relation), probe,
metric, variant, reference_variant, comparison, value, and its name. It passes only when the
whole interval of its quantity meets the bound; unmeasured or straddling means failed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

# What identifies a criterion as measured; the merge gate matches these to the pinned version.
CRITERION_KEYS = ("kind", "probe", "metric", "variant", "reference_variant", "comparison",
                  "value")


def _canonical(variant: str) -> str:
    """'b = 2, a=1' -> 'a=1,b=2': sorted by key, as infraops.models.variant_key spells the
    variants samples are stored under (sorting the 'k=v' texts would order 'a0' before 'a')."""
    pairs = [p.strip() for p in variant.split(",") if p.strip()]
    split = (p.partition("=") for p in pairs)
    return ",".join(f"{k}={v}" for k, v in sorted((k.strip(), v.strip()) for k, _, v in split))


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


def criterion_name(spec: dict[str, Any]) -> str:
    """What verdicts call the criterion: its name, else its condition in words."""
    return str(spec.get("name") or spec.get("description")
               or f"{spec.get('probe')}.{spec.get('metric')}")


def criterion_cells(spec: dict[str, Any]) -> list[str]:
    """The variant cells (canonical) the criterion reads: its variant unless blank (blank reads
    every cell that ran), and a relation's reference_variant."""
    cells = [_canonical(spec.get("variant") or "")]
    if spec.get("kind") == "relation":
        cells.append(_canonical(spec.get("reference_variant") or ""))
    return list(dict.fromkeys(cell for cell in cells if cell))


Values = Callable[[str, str], list[float]]  # (variant, side) -> samples of the criterion's metric


def evaluate_criterion_ci(spec: dict[str, Any], values: Values, *, seed: int = 0
                          ) -> IntervalVerdict:
    """Judge one criterion spec (see AcceptanceCriterion.as_spec) on raw samples.

    threshold: the candidate median with a bootstrap 95% CI; relative: candidate/baseline - 1
    from stats.compare; relation: scenario/reference - 1 on the candidate, from stats.compare.
    """
    from infraops.feedback import stats

    description = criterion_name(spec)
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
