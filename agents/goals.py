"""What the goal page reads: the goal's metric across the base and every merged change (the
"v0 -> v3" evolution). What each goal version changed, in words, is
infraops.services.goals.spec_changes."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connection

from agents.models import AgentRun
from infraops.experiments.services import queue_for
from infraops.experiments.workers import live_queues
from infraops.feedback.findings import about_baseline
from infraops.manifest import Manifest
from infraops.models import Boundary, Experiment, Goal, GoalVersion
from infraops.reads import JoinedRead
from reviews.models import Change, ReviewDecision, approved_over_failing_checks


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
    overridden: bool = False  # merged over failing checks (the override step)


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
               .annotate(overridden=approved_over_failing_checks())
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
                            unit, change.pk,
                            change.overridden))  # type: ignore[attr-defined]  # annotated
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
    # Merged over failing checks (issue 27): how many, and the part of the gain their own
    # measurements account for, as a share of the base (positive: better), or None.
    overridden: int = 0
    overridden_gain: float | None = None

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
    def overridden_text(self) -> str:
        """'30.1% better from 1 change merged over failing checks': the part of the progress
        those changes measured; '' when none merged so."""
        if not self.overridden:
            return ""
        changes = f"{self.overridden} change{'s' * (self.overridden != 1)}"
        part = self.overridden_gain
        if self.gain is None or part is None:
            return f"{changes} merged over failing checks"
        return (f"{abs(part):.1%} {'better' if part >= 0 else 'worse'} from {changes} merged "
                "over failing checks")

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
    """Every goal of these targets (None: every target) with its progress, in two queries
    whatever the number of goals: the dashboard's list, and the goal page's line."""
    goals = _goals(target_ids)
    active: dict[int, int] = {}
    counts: dict[tuple[int, str], int] = {}
    summaries: dict[int, list[tuple[dict[str, Any], bool]]] = {}
    overridden: dict[int, int] = {}
    for kind, goal_id, status, n, comparisons, failing, _, _, over in _goal_rows(target_ids):
        if kind == "run":
            active[goal_id] = n
        elif kind == "change":
            counts[(goal_id, status)] = n
        else:
            overridden[goal_id] = overridden.get(goal_id, 0) + bool(over)
            if credited({"findings": _json(failing) or []}):
                # a cheat merged over its integrity failure moves nothing
                summaries.setdefault(goal_id, []).append(
                    ({"comparisons": _json(comparisons) or []}, bool(over)))
    result = []
    needs = goal_needs(goals)
    for goal in goals:
        measured = [(row, over) for summary, over in summaries.get(goal.pk, [])
                    if (row := _goal_row(summary, goal)) is not None]
        base = float(measured[0][0]["baseline_median"]) if measured else None
        result.append(Progress(
            goal, base, float(measured[-1][0]["candidate_median"]) if measured else None,
            str(measured[0][0].get("unit") or "") if measured else "",
            active.get(goal.pk, 0), counts.get((goal.pk, Change.Status.MERGED), 0),
            counts.get((goal.pk, Change.Status.PENDING_REVIEW), 0), needs[goal.pk],
            overridden.get(goal.pk, 0),
            _gain_of(goal, base, [row for row, over in measured if over])))
    return result


# The goals of some targets (or of every one), by target and name, each with its target, read
# by statements built once per process: building the ORM's query was a sixth of the
# dashboard's web CPU (bench/load.py).
_GOALS = {every: JoinedRead(Goal, "target", where="TRUE" if every else 't0."target_id" = ANY(%s)',
                            order_by='t1."name", t0."name"') for every in (False, True)}
_BOUNDARIES = JoinedRead(Boundary, where='t0."goal_id" = ANY(%s)')


def _goals(target_ids: list[int] | None) -> list[Goal]:
    """As Goal.objects.select_related("target", "boundary") in the goals' order would give
    them: each goal's boundary (or its absence) known without another query."""
    goals = _GOALS[target_ids is None].all(*(() if target_ids is None else (target_ids,)))
    boundaries = {b.goal_id: b for b in _BOUNDARIES.all([goal.pk for goal in goals])}
    for goal in goals:
        boundary = boundaries.get(goal.pk)
        Goal.boundary.related.set_cached_value(goal, boundary)
        if boundary is not None:
            Boundary.goal.field.set_cached_value(boundary, goal)
    return goals


def _gain_of(goal: Goal, base: float | None, rows: list[dict[str, Any]]) -> float | None:
    """The part of a goal's gain these merged changes' own measurements account for: each
    one's step, candidate against the base it merged onto, as a share of the goal's first
    base (positive: better); None without a base or a row."""
    if not base or not rows:
        return None
    steps = sum(float(r["candidate_median"]) - float(r["baseline_median"]) for r in rows)
    moved = steps / abs(base)
    return -moved if goal.direction == Goal.Direction.MINIMIZE else moved


# The findings of an experiment's feedback that can take its credit away (`credited` decides):
# only those leave the database, not a merged change's whole feedback on every dashboard read.
_UNCREDITING = ('$.findings[*] ? (@.evidence.credited == false || '
                '(@.layer == "integrity" && @.severity == "fail"))')


@functools.cache
def _goal_statement(every: bool) -> str:
    """The active runs per goal, the changes per goal and status, and each merged change's
    comparisons with its uncrediting findings (in merge order) and whether it merged over
    failing checks, as one statement of rows (kind, goal, status, count, comparisons,
    findings, merged at, id, overridden); written once per process."""
    quote = connection.ops.quote_name
    run, version = quote(AgentRun._meta.db_table), quote(GoalVersion._meta.db_table)
    change, experiment = quote(Change._meta.db_table), quote(Experiment._meta.db_table)
    decision = quote(ReviewDecision._meta.db_table)
    scope = "" if every else "AND t.target_id = ANY(%s)"
    # Table names from the models' metadata, quoted; every value is bound. The EXISTS is
    # reviews.models.approved_over_failing_checks, which the goal page's ORM reads use.
    return f"""
        SELECT 'run', v.goal_id, '', count(*), NULL::jsonb, NULL::jsonb, NULL::timestamptz, 0,
               FALSE
          FROM {run} t JOIN {version} v ON v.id = t.goal_version_id
         WHERE t.status = ANY(%s) {scope} GROUP BY v.goal_id
        UNION ALL
        SELECT 'change', t.goal_id, t.status, count(*), NULL, NULL, NULL, 0, FALSE
          FROM {change} t WHERE t.goal_id IS NOT NULL {scope} GROUP BY t.goal_id, t.status
        UNION ALL
        SELECT 'merged', t.goal_id, '', 0, e.summary -> 'comparisons',
               jsonb_path_query_array(e.feedback, %s), t.merged_at, t.id,
               EXISTS (SELECT 1 FROM {decision} d WHERE d.change_id = t.id
                          AND d.decision = %s AND d.overridden_checks <> '[]'::jsonb)
          FROM {change} t LEFT JOIN {experiment} e ON e.id = t.experiment_id
         WHERE t.goal_id IS NOT NULL AND t.status = %s {scope}
         ORDER BY 7, 8"""  # noqa: S608  # nosec B608


def _goal_rows(target_ids: list[int] | None) -> list[tuple[Any, ...]]:
    scope = [] if target_ids is None else [target_ids]
    params: list[Any] = [list(AgentRun.active_statuses()), *scope, *scope, _UNCREDITING,
                         ReviewDecision.Decision.APPROVE, Change.Status.MERGED, *scope]
    with connection.cursor() as cursor:
        cursor.execute(_goal_statement(target_ids is None), params)
        return list(cursor.fetchall())


def _json(value: Any) -> Any:
    """A jsonb column as Python: psycopg may hand it over as text."""
    return json.loads(value) if isinstance(value, str | bytes) else value


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
