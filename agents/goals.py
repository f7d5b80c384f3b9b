"""What the goal page reads: the goal's metric across the base and every merged change (the
"v0 -> v3" evolution). What each goal version changed, in words, is
infraops.services.goals.spec_changes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from infraops.models import Goal
from reviews.models import Change


@dataclass(frozen=True)
class Point:
    """One version of the code: its measured median of the goal metric, with the 95% interval
    its experiment gave (the candidate/base ratio's interval applied to the base's median)."""

    label: str
    median: float
    low: float | None
    high: float | None
    unit: str
    change: int | None  # the merged change it is (None for the base)


def _comparison(change: Change, probe: str, metric: str) -> dict[str, Any] | None:
    """The evidence experiment's comparison of the goal metric (its first cell), with the
    interval from the feedback's finding on it when there is one."""
    experiment = change.experiment
    if experiment is None:
        return None
    for finding in (experiment.feedback or {}).get("findings", []):
        found = (finding.get("evidence") or {}).get("comparison")
        if isinstance(found, dict) and finding.get("title", "").startswith(probe) and \
                f" {metric} " in f" {finding.get('title', '')} ":
            return found
    for row in (experiment.summary or {}).get("comparisons", []):
        if row.get("probe") == probe and row.get("metric") == metric:
            return dict(row)
    return None


def evolution(goal: Goal) -> list[Point]:
    """The base, then each merged change of the goal in merge order, where its evidence
    measured the goal metric. Each change was measured against the base it merged onto, in its
    own experiment: points of different experiments compare across machine noise."""
    points: list[Point] = []
    changes = (Change.objects.filter(goal=goal, status=Change.Status.MERGED)
               .select_related("experiment").order_by("merged_at", "pk"))
    for change in changes:
        found = _comparison(change, goal.probe, goal.metric)
        if not found or not found.get("baseline_median") or found.get("candidate_median") is None:
            continue
        base, head = float(found["baseline_median"]), float(found["candidate_median"])
        unit = str(found.get("unit") or "")
        if not points:
            points.append(Point("v0 (base)", base, None, None, unit, None))
        low, high = found.get("ci_low"), found.get("ci_high")
        points.append(Point(f"v{len(points)} (change {change.pk})", head,
                            base * low if isinstance(low, int | float) else None,
                            base * high if isinstance(high, int | float) else None,
                            unit, change.pk))
    return points
