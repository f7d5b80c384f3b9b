"""What the goal page reads: the goal's metric across the base and every merged change (the
"v0 -> v3" evolution), and what changed from one goal version to the next, in words."""

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


def _flat(spec: Any, prefix: str = "") -> dict[str, str]:
    if isinstance(spec, dict):
        flat: dict[str, str] = {}
        for key, value in spec.items():
            if key == "id":
                continue
            flat |= _flat(value, f"{prefix}.{key}" if prefix else str(key))
        return flat
    if isinstance(spec, list) and all(not isinstance(v, dict | list) for v in spec):
        return {prefix: ", ".join(str(v) for v in spec) or "none"}
    if isinstance(spec, list):
        flat = {}
        for index, value in enumerate(spec, 1):
            flat |= _flat(value, f"{prefix}[{index}]")
        return flat
    return {prefix: "none" if spec in (None, "") else str(spec)}


def spec_changes(before: dict[str, Any] | None, after: dict[str, Any]) -> list[str]:
    """What a goal version changed against the one before, one line a setting:
    'boundary.max_experiments: 8 → 12'; 'added criteria[2].name: …'."""
    if before is None:
        return ["the first version"]
    old, new = _flat(before), _flat(after)
    lines = []
    for key in sorted(old.keys() | new.keys()):
        if key not in old:
            lines.append(f"added {key}: {new[key]}")
        elif key not in new:
            lines.append(f"removed {key} (was {old[key]})")
        elif old[key] != new[key]:
            lines.append(f"{key}: {old[key]} → {new[key]}")
    return lines or ["no setting changed"]
