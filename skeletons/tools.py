"""Skeleton tools: the library of reusable optimisation techniques (skeletons/models.py).

- ``skeleton_search``: the skeletons whose conditions the probe's metadata and the run's
  measured facts do not rule out, each with the conditions met and those unknown;
- ``skeleton_apply``: record that the run applies a skeleton (the agent then edits the code
  itself); the change the run submits decides the use's outcome
  (skeletons/outcomes.py).

Contracts: metadata is the pinned manifest's entry of the probe (its name, layer, covered
globs and ``meta``) with the bottlenecks the run's finished experiments measured
(``skeletons.applicability``); a condition on a field neither knows is reported unknown, never
taken as met. Drafts are left out unless asked for, and a draft proposed from another
target's change is never shown. Unknown probes and skeletons are ToolErrors naming what
exists.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from agents.events import run_event
from agents.models import AgentRun
from agents.policies.shared import pinned_manifest
from agents.tools.base import ToolContext, ToolError, ToolResult, tool
from agents.tools.run import the_run
from agents.tools.schema import obj, string
from infraops.manifest import Probe
from infraops.models import Experiment
from skeletons.applicability import (
    MET,
    UNKNOWN,
    Check,
    Fact,
    evaluate,
    measured_facts,
    probe_metadata,
    ruled_out,
    with_facts,
)
from skeletons.models import Skeleton, SkeletonQuerySet, SkeletonUse, UsageStats, usage_of

MAX_LISTED = 8  # skeletons answered by one search
MAX_TRANSFORMATION_CHARS = 1500  # of each skeleton's transformation, in a search answer
MAX_NAMED = 30  # skeletons or probes named in a hint
FACT_EXPERIMENTS = 50  # the run's most recent finished experiments read for facts


@tool(
    "skeleton_search",
    "Known techniques that fit a probe.",
    obj({
        "query": string("Words to look for in names, summaries and transformations.", 200),
        "probe": string("A probe name from list_probes; default: the goal's probe.", 200,
                        minLength=1),
        "include_drafts": {"type": "boolean", "default": False,
                           "description": "Also search drafts nobody has reviewed yet."},
    }),
    untrusted=True, needs_run=True,
)
def _skeleton_search(ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
    run = the_run(ctx)
    probe = _probe(run, args.get("probe") or run.goal_version.spec.get("probe", ""))
    facts = run_facts(run, probe.name)
    metadata = with_facts(probe_metadata(probe), facts)
    found = []
    for skeleton in _candidates(run, args.get("query") or "", args["include_drafts"]):
        checks = evaluate(skeleton.predicates(), metadata)
        if not ruled_out(checks):
            found.append((skeleton, checks))
    # Best first: the fewest unknown conditions, then the most met, then trust.
    found.sort(key=lambda pair: (_count(pair[1], UNKNOWN), -_count(pair[1], MET),
                                 _TRUST[pair[0].status], pair[0].name))
    lines = [_known_line(probe, facts)]
    if not found:
        lines.append("No skeleton fits: every one has a condition this probe does not meet"
                     + (" or lacks those words." if args.get("query") else "."))
    shown = found[:MAX_LISTED]
    usage = usage_of([skeleton.pk for skeleton, _ in shown])
    for skeleton, checks in shown:
        lines += _skeleton_lines(skeleton, checks, usage[skeleton.pk])
    if len(found) > MAX_LISTED:
        lines.append(f"({len(found) - MAX_LISTED} more fit; narrow with `query`.)")
    return ToolResult(True, "\n".join(lines), {
        "probe": probe.name, "facts": [dataclasses.asdict(f) for f in facts],
        "skeletons": [{"slug": s.slug, "status": s.status,
                       "met": [c.predicate.describe() for c in checks if c.state == MET],
                       "unknown": [c.predicate.describe() for c in checks if c.state == UNKNOWN]}
                      for s, checks in shown]})


@tool(
    "skeleton_apply",
    "Say you apply a skeleton.",
    obj({
        "skeleton": string("The skeleton's slug, as skeleton_search shows it.", 80, minLength=1),
        "note": string("What you apply it to (file, function) and how you adapt it.", 2_000,
                       minLength=1),
    }, required=["skeleton", "note"]),
    needs_run=True,
)
def _skeleton_apply(ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
    run = the_run(ctx)
    skeleton = _candidates(run, "", include_drafts=True).filter(slug=args["skeleton"]).first()
    if skeleton is None:
        slugs = list(_candidates(run, "", include_drafts=True)
                     .values_list("slug", flat=True)[:MAX_NAMED])
        raise ToolError(f"no skeleton {args['skeleton'][:80]!r} in the library",
                        f"Use a slug skeleton_search showed; the library has: "
                        f"{', '.join(slugs) or 'nothing yet'}.")
    use, made = SkeletonUse.objects.update_or_create(
        skeleton=skeleton, run=run, outcome=SkeletonUse.Outcome.APPLIED,
        defaults={"note": args["note"]})
    said = "recorded" if made else "was already recorded; its note is updated"
    run_event(run_id=run.pk, kind="step", data={"skeleton": skeleton.slug, "use": use.pk},
              message=f"Applies skeleton {skeleton.name} ({skeleton.status}): "
                      f"{args['note'][:300]}")
    return ToolResult(True, f"Use of {skeleton.slug} {said}. Now make the edits; the change "
                      "you submit carries this use.", {"use": use.pk, "skeleton": skeleton.slug})


_TRUST: dict[str, int] = {Skeleton.Status.TRUSTED: 0, Skeleton.Status.REVIEWED: 1,
                          Skeleton.Status.DRAFT: 2}


def run_facts(run: AgentRun, probe: str) -> list[Fact]:
    """The bottlenecks the run's finished experiments measured on `probe`."""
    finished = (Experiment.Status.SUCCEEDED, Experiment.Status.FAILED)
    rows = (run.experiments.filter(status__in=finished)
            .order_by("-pk").values_list("pk", "feedback")[:FACT_EXPERIMENTS])
    return measured_facts([(pk, feedback or {}) for pk, feedback in rows], probe)


def _probe(run: AgentRun, name: str) -> Probe:
    manifest = pinned_manifest(run)
    probe = manifest.probe(name)
    if probe is None:
        names = ", ".join(p.name for p in manifest.probes[:MAX_NAMED])
        raise ToolError(f"no probe {name[:100]!r} in the run's manifest",
                        f"Its probes: {names or 'none'}.")
    return probe


def _candidates(run: AgentRun, query: str, include_drafts: bool) -> SkeletonQuerySet:
    """The library as this run may read it: drafts only when asked, and only those of no
    change or of a change on the run's own target."""
    found = Skeleton.objects.visible_to([run.target_id]).search(query)
    return found if include_drafts else found.exclude(status=Skeleton.Status.DRAFT)


def _count(checks: list[Check], state: str) -> int:
    return sum(1 for check in checks if check.state == state)


def _known_line(probe: Probe, facts: list[Fact]) -> str:
    """What the conditions were checked against: what the manifest declares of the probe,
    and what the run's experiments measured, with where."""
    declared = ", ".join(f"{key}={_plain(value)}" for key, value in probe_metadata(probe).items()
                         if key not in ("probe", "covers"))
    measured = "; ".join(f"{f.field}={f.value} ({f.source})" for f in facts) or "none yet"
    return f"Probe {probe.name}: {declared}. Measured: {measured}."


def _skeleton_lines(skeleton: Skeleton, checks: list[Check], usage: UsageStats) -> list[str]:
    met = [f"{c.predicate.describe()} ({c.reason})" for c in checks if c.state == MET]
    unknown = [f"{c.predicate.describe()} ({c.reason})" for c in checks if c.state == UNKNOWN]
    transformation = skeleton.transformation
    if len(transformation) > MAX_TRANSFORMATION_CHARS:
        transformation = transformation[:MAX_TRANSFORMATION_CHARS] + " [...]"
    lines = ["", f"## {skeleton.slug} ({skeleton.status}): {skeleton.name}", skeleton.summary,
             f"Met: {'; '.join(met) or 'no checkable condition'}."]
    if unknown:
        lines.append(f"Unknown (check these yourself): {'; '.join(unknown)}.")
    if skeleton.applicability_prose:
        lines.append(f"When it applies: {skeleton.applicability_prose}")
    lines += [f"Transformation:\n{transformation}"]
    if skeleton.resource_constraints:
        lines.append(f"Costs: {skeleton.resource_constraints}")
    lines.append(f"Record: {usage.describe()}; from {skeleton.provenance}.")
    return lines


def _plain(value: Any) -> str:
    return "|".join(map(str, value)) if isinstance(value, list | tuple) else str(value)
