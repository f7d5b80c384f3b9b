"""Goal versions: every saved edit of a goal, its boundary or criteria is a new snapshot."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.db import transaction

from infraops.manifest import Manifest
from infraops.models import Boundary, Goal, GoalVersion
from infraops.services.audit import audit_record


def metric_problem(manifest: Manifest | None, probe: str, metric: str) -> str | None:
    """Why (probe, metric) cannot be measured with this manifest, in words; None if it can."""
    if manifest is None:
        return "The target has no valid infraops.toml yet: fix it and refresh the target."
    found = manifest.probe(probe)
    if found is None:
        names = ", ".join(p.name for p in manifest.probes) or "none"
        return f"The manifest has no probe {probe!r} (probes: {names})."
    if metric not in found.metrics:
        if not found.metrics:
            return (f"Probe {probe!r} reports no metric {metric!r}: it lists no metrics (a "
                    "correctness probe is judged on its outputs).")
        reported = ", ".join(found.metrics)
        return f"Probe {probe!r} reports no metric {metric!r} (it reports: {reported})."
    return None


def goal_spec(goal: Goal) -> dict[str, Any]:
    """Everything a run needs to know about the goal, as plain data."""
    boundary = Boundary.objects.filter(goal=goal).first() or Boundary(goal=goal)
    return {
        "name": goal.name,
        "target": goal.target.name,
        "probe": goal.probe,
        "metric": goal.metric,
        "direction": goal.direction,
        "relative_target": goal.relative_target,
        "absolute_target": goal.absolute_target,
        "min_effect": goal.min_effect,
        "policy": goal.policy,
        "model_name": goal.model_name,
        "auto_merge": goal.auto_merge,
        "boundary": boundary.as_spec(),
        "criteria": [c.as_spec() for c in goal.criteria.order_by("pk")],
    }


def goal_snapshot(*, goal: Goal, user: User | None = None) -> GoalVersion:
    """Record the goal as it is now as a new version, unless nothing changed since the last.

    Runs pin a version, so editing a goal never changes a run that already started.
    """
    with transaction.atomic():
        locked = Goal.objects.select_for_update().get(pk=goal.pk)
        spec = goal_spec(locked)
        latest = locked.versions.order_by("-number").first()
        if latest is not None and latest.spec == spec:
            return latest
        version = GoalVersion.objects.create(
            goal=locked, number=locked.current_version + 1, spec=spec, created_by=user
        )
        Goal.objects.filter(pk=locked.pk).update(current_version=version.number)
        goal.current_version = version.number
        audit_record(actor=user, action="goal.version", obj=locked, data={"number": version.number})
    return version


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
