"""What the goal page reads: the goal's metric across the base and every merged change (the
"v0 -> v3" evolution). What each goal version changed, in words, is
infraops.services.goals.spec_changes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db.models import Count

from agents.models import AgentRun
from infraops.experiments.services import queue_for
from infraops.experiments.workers import live_queues
from infraops.feedback.findings import about_baseline
from infraops.manifest import Manifest
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


def credited(feedback: dict[str, Any] | None) -> bool:
    """Whether an experiment's gain may count toward its goal: not when the candidate failed
    an integrity check (a cheat's speed-up is the cheat's effect; the feedback then marks its
    improvements ``credited: False``, infraops.feedback.findings.uncredited)."""
    for finding in (feedback or {}).get("findings", []):
        evidence = finding.get("evidence") or {}
        if evidence.get("credited") is False:
            return False
        if (finding.get("layer") == "integrity" and finding.get("severity") == "fail"
                and not about_baseline(evidence)):
            return False
    return True


def evolution(goal: Goal) -> list[Point]:
    """The base, then each merged change of the goal in merge order, where its evidence
    measured the goal metric. Each change was measured against the base it merged onto, in its
    own experiment: points of different experiments compare across machine noise."""
    points: list[Point] = []
    changes = (Change.objects.filter(goal=goal, status=Change.Status.MERGED)
               .select_related("experiment").order_by("merged_at", "pk"))
    for change in changes:
        if change.experiment is not None and not credited(change.experiment.feedback):
            continue  # merged over an integrity failure: no point of the goal's progress
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


@dataclass(frozen=True)
class Need:
    """What a goal needs beyond the CPU workers of every install, and whether this one has it
    now: an LLM endpoint for its policy, a worker with hardware for its probe. A goal that
    cannot run here is marked so on the dashboard, not drawn like the others."""

    what: str  # "an LLM endpoint", "a worker with gpu"
    here: bool
    how: str  # how to provide it, in words


@dataclass(frozen=True)
class Progress:
    """A goal as the dashboard shows it: how far its merged changes moved the metric from the
    base, against its target, and what is going on for it now."""

    goal: Goal
    base: float | None  # the base's median of the goal metric, before the first merged change
    head: float | None  # the last merged change's median
    unit: str
    active_runs: int
    merged: int
    awaiting_review: int
    needs: tuple[Need, ...] = ()

    @property
    def runs_here(self) -> bool:
        """Whether this install has everything the goal needs."""
        return all(need.here for need in self.needs)

    @property
    def gain(self) -> float | None:
        """The improvement so far as a share of the base (positive: better), or None."""
        if self.base is None or self.head is None or self.base == 0:
            return None
        moved = (self.head - self.base) / abs(self.base)
        return -moved if self.goal.direction == Goal.Direction.MINIMIZE else moved

    @property
    def gain_text(self) -> str:
        """'5.2% better' / '1.0% worse', from the base to the last merged change."""
        gain = self.gain
        if gain is None:
            return ""
        return f"{abs(gain):.1%} {'better' if gain >= 0 else 'worse'}"

    @property
    def moved(self) -> str:
        """'10 → 8.5 ms': the base's median and the last merged change's."""
        if self.base is None or self.head is None:
            return ""
        return f"{self.base:.4g} → {self.head:.4g} {self.unit}".rstrip()

    @property
    def done(self) -> float | None:
        """The share of the goal's target reached (0 to 1), or None without a target or a
        measurement: the relative target when it has one, else the way to the absolute one."""
        gain = self.gain
        if gain is None or self.base is None or self.head is None:
            return None
        if self.goal.relative_target:
            return min(max(gain / self.goal.relative_target, 0.0), 1.0)
        if self.goal.absolute_target is not None and self.goal.absolute_target != self.base:
            way = (self.head - self.base) / (self.goal.absolute_target - self.base)
            return min(max(way, 0.0), 1.0)
        return None


def goal_progress(target_ids: list[int] | None) -> list[Progress]:
    """Every goal of these targets (None: every target) with its progress, in four queries
    whatever the number of goals: the dashboard's list."""
    goals = Goal.objects.select_related("target", "boundary").order_by("target__name", "name")
    runs = AgentRun.objects.filter(status__in=AgentRun.active_statuses())
    changes = Change.objects.filter(goal__isnull=False)
    if target_ids is not None:
        goals = goals.filter(target_id__in=target_ids)
        runs = runs.filter(target_id__in=target_ids)
        changes = changes.filter(target_id__in=target_ids)
    active = dict(runs.values("goal_version__goal_id").annotate(n=Count("id"))
                  .values_list("goal_version__goal_id", "n"))
    counts: dict[tuple[int, str], int] = {
        (goal, status): n for goal, status, n in
        changes.values("goal_id", "status").annotate(n=Count("id"))
        .values_list("goal_id", "status", "n")}
    summaries: dict[int, list[dict[str, Any]]] = {}
    for goal_id, summary, feedback in (changes.filter(status=Change.Status.MERGED)
                             .order_by("merged_at", "pk")
                             .values_list("goal_id", "experiment__summary",
                                          "experiment__feedback")):
        if credited(feedback):  # a cheat merged over its integrity failure moves nothing
            summaries.setdefault(goal_id, []).append(summary or {})
    result = []
    needs = goal_needs(list(goals))
    for goal in goals:
        measured = [row for summary in summaries.get(goal.pk, [])
                    if (row := _goal_row(summary, goal)) is not None]
        result.append(Progress(
            goal, float(measured[0]["baseline_median"]) if measured else None,
            float(measured[-1]["candidate_median"]) if measured else None,
            str(measured[0].get("unit") or "") if measured else "",
            active.get(goal.pk, 0), counts.get((goal.pk, Change.Status.MERGED), 0),
            counts.get((goal.pk, Change.Status.PENDING_REVIEW), 0), needs[goal.pk]))
    return result


def goal_needs(goals: list[Goal]) -> dict[int, tuple[Need, ...]]:
    """Each goal's needs (Need): its target's manifest read once per target, the workers'
    heartbeats only when some probe needs hardware."""
    manifests: dict[int, Manifest | None] = {}
    live: set[str] | None = None
    found: dict[int, tuple[Need, ...]] = {}
    for goal in goals:
        needs = []
        if goal.policy == Goal.Policy.LLM:
            needs.append(Need("an LLM endpoint", bool(settings.OPENAI_BASE_URL),
                              "set OPENAI_BASE_URL, or start the standalone with --demo-llm"))
        if goal.target_id not in manifests:
            manifests[goal.target_id] = goal.target.manifest()
        manifest = manifests[goal.target_id]
        probe = manifest.probe(goal.probe) if manifest is not None else None
        if probe is not None and probe.requires:
            queue = queue_for([probe])
            live = live_queues() or set() if live is None else live
            needs.append(Need(f"a worker with {' and '.join(probe.requires)}", queue in live,
                              f"its probe {probe.name} runs on queue {queue}: docs/gpu.md"))
        found[goal.pk] = tuple(needs)
    return found


def _goal_row(summary: dict[str, Any], goal: Goal) -> dict[str, Any] | None:
    """The summary's comparison of the goal metric (its first cell) with both medians."""
    for row in summary.get("comparisons", []):
        if row.get("probe") == goal.probe and row.get("metric") == goal.metric and \
                row.get("baseline_median") and row.get("candidate_median") is not None:
            return dict(row)
    return None
