"""What a decided change tells the skeleton library (skeletons/models.py).

When a change merges, the uses of skeletons its run recorded (skeletons/tools.py; the
library ties them to each change the run submits) are accepted, with the gain its evidence verified
on
the goal's metric, and become the skeletons' evidence. A merged change with a verified gain
whose run applied no skeleton proposes a draft skeleton from itself, for a person to promote.
When a change is rejected, its uses are rejected. Sent after the commit that decides the change
(skeletons.tasks.skeleton_outcome, on reviews' change_decided signal), and safe to run twice:
uses move only out of "applied", and a change proposes at most one draft (Skeleton.proposed_from
is unique).
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterable, Mapping
from statistics import median
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.text import slugify

from infraops import gitops
from infraops.errors import DomainError
from infraops.manifest import ManifestError, Probe
from infraops.services.targets import target_manifest_at
from reviews.models import Change
from skeletons.applicability import Fact, draft_conditions, measured_facts
from skeletons.models import Skeleton, SkeletonEvidence, SkeletonUse

log = logging.getLogger(__name__)

MAX_SLUG = 80


def skeleton_outcome_record(*, change_id: int) -> list[int]:
    """Record what the change's decision means for the library; returns the ids of the uses
    it decided (and of none for a change still undecided)."""
    change = (Change.objects.select_related("experiment", "goal_version", "target")
              .filter(pk=change_id).first())
    if change is None:
        return []
    if change.status == Change.Status.REJECTED:
        return _decide_uses(change, SkeletonUse.Outcome.REJECTED, gain=None)
    if change.status != Change.Status.MERGED:
        return []
    gain = change_gain(change)
    decided = _decide_uses(change, SkeletonUse.Outcome.ACCEPTED, gain=gain)
    if gain is not None and not SkeletonUse.objects.filter(change=change).exists() \
            and _from_an_agent(change):
        skeleton_propose(change=change, gain=gain)
    return decided


def skeleton_uses_from_knobs(*, change_id: int) -> list[int]:
    """The uses a submitted change records by the knobs it sets: a knob whose manifest entry
    names a skeleton (infraops.toml, [[knob]] skeleton = "<slug>") applies that technique,
    whoever turned it. The built-in tuner never calls skeleton_apply, so the showcase's three
    merged changes, each setting such a knob, left their skeletons "not applied yet". Returns
    the ids of the uses made; one open use per skeleton and run, as skeleton_apply keeps."""
    change = Change.objects.select_related("target").filter(pk=change_id).first()
    manifest = change.target.manifest() if change is not None else None
    if change is None or manifest is None:
        return []
    added = added_lines(change.diff)
    made = []
    for knob in manifest.knobs:
        skeleton = Skeleton.objects.filter(slug=knob.skeleton).first() if knob.skeleton else None
        pattern = re.compile(knob.pattern, re.MULTILINE)
        if skeleton is None or not any(pattern.search(line) for line in added.get(knob.file, ())):
            continue
        for run_id in change.runs.values_list("pk", flat=True):
            use, created = SkeletonUse.objects.get_or_create(
                skeleton=skeleton, run_id=run_id, outcome=SkeletonUse.Outcome.APPLIED,
                defaults={"change": change,
                          "note": f"change {change.pk} sets the knob {knob.name} in {knob.file}, "
                                  "which applies this skeleton (its manifest entry says so)"})
            if created:
                made.append(use.pk)
    return made


def added_lines(diff: str) -> dict[str, list[str]]:
    """A unified diff's added lines, by the path they were added to ("+++ b/<path>"). Inside
    a hunk its line counts decide what a line is, so an added or removed line whose text
    begins with "++ " or "-- " is never read as a file's header."""
    found: dict[str, list[str]] = {}
    path: str | None = None
    old = new = 0  # the current hunk's lines still to come, on each side
    for line in diff.splitlines():
        if old > 0 or new > 0:
            if line.startswith("+"):
                new -= 1
                if path is not None:
                    found.setdefault(path, []).append(line[1:])
            elif line.startswith("-"):
                old -= 1
            elif not line.startswith("\\"):  # not "\ No newline at end of file"
                old, new = old - 1, new - 1
        elif line.startswith("+++ "):
            name = line[4:].split("\t")[0].strip()
            path = None if name == "/dev/null" else name.removeprefix("b/")
        elif hunk := _HUNK.match(line):
            old, new = (int(count) if count is not None else 1 for count in hunk.groups())
    return found


_HUNK = re.compile(r"@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")


def change_gain(change: Change) -> float | None:
    """How many times better the change made the goal's metric, from its evidence experiment:
    the median over the metric's improved cells, each as baseline/candidate for a metric to
    lower and candidate/baseline for one to raise. None unless the evidence verified it: no
    goal or experiment, no "improved" verdict on that metric, or a cell that regressed."""
    spec: Mapping[str, Any] = change.goal_version.spec if change.goal_version else {}
    experiment = change.experiment
    if not spec.get("probe") or experiment is None:
        return None
    return verified_gain((experiment.feedback or {}).get("findings") or [],
                         probe=spec["probe"], metric=spec.get("metric", ""))


def verified_gain(findings: Iterable[Mapping[str, Any]], *, probe: str, metric: str
                  ) -> float | None:
    """The median gain of `probe`'s `metric` over its performance findings (see change_gain)."""
    gains = []
    for finding in findings:
        evidence = finding.get("evidence") or {}
        if finding.get("kind") != "perf-comparison" or evidence.get("probe") != probe \
                or evidence.get("metric") != metric:
            continue
        comparison = evidence.get("comparison") or {}
        if comparison.get("verdict") == "regressed":
            return None
        ratio = comparison.get("ratio")
        if comparison.get("verdict") == "improved" and isinstance(ratio, int | float) \
                and math.isfinite(ratio) and ratio > 0:
            gains.append(1 / ratio if comparison.get("direction") != "maximize" else ratio)
    return float(median(gains)) if gains else None


def _decide_uses(change: Change, outcome: str, *, gain: float | None) -> list[int]:
    """Move the change's open uses to `outcome`; an accepted use with a gain is evidence."""
    with transaction.atomic():
        uses = list(SkeletonUse.objects.select_for_update()
                    .filter(change=change, outcome=SkeletonUse.Outcome.APPLIED))
        SkeletonUse.objects.filter(pk__in=[use.pk for use in uses]).update(
            outcome=outcome, gain=gain, decided_at=timezone.now())
        if outcome == SkeletonUse.Outcome.ACCEPTED and gain is not None:
            for skeleton_id in {use.skeleton_id for use in uses}:
                SkeletonEvidence.objects.get_or_create(
                    skeleton_id=skeleton_id, experiment=change.experiment, change=change,
                    defaults={"note": f"applied in change {change.pk}, merged with a "
                                      f"{gain:.2f}x gain"})
    return [use.pk for use in uses]


def _from_an_agent(change: Change) -> bool:
    """A knob value the built-in tuner found is this target's configuration, not a technique
    to reuse elsewhere: only the LLM agent's changes propose skeletons."""
    spec = change.goal_version.spec if change.goal_version else {}
    return spec.get("policy") != "tuner"


def skeleton_propose(*, change: Change, gain: float) -> Skeleton:
    """The draft skeleton proposed from a merged change (made once): its title and
    hypothesis as the transformation, its evidence experiment and itself as evidence, the
    conditions it worked under as a start (skeletons.applicability.draft_conditions)."""
    existing = Skeleton.objects.filter(proposed_from=change).first()
    if existing is not None:
        return existing
    try:
        with transaction.atomic():
            skeleton = Skeleton.objects.create(**_draft_fields(change, gain))
            SkeletonEvidence.objects.create(skeleton=skeleton, change=change,
                                            experiment=change.experiment,
                                            note=f"proposed from; merged with a {gain:.2f}x gain")
    except IntegrityError:
        # A concurrent run of this same outcome made it first.
        return Skeleton.objects.get(proposed_from=change)
    log.info("change %s proposed draft skeleton %s", change.pk, skeleton.slug)
    return skeleton


def _draft_fields(change: Change, gain: float) -> dict[str, Any]:
    spec: Mapping[str, Any] = change.goal_version.spec if change.goal_version else {}
    where = f"{spec.get('probe')}.{spec.get('metric')}" if spec.get("probe") else "its goal"
    hypothesis = change.hypothesis.strip() or "(no hypothesis given)"
    return {
        "name": change.title[:200], "slug": _free_slug(change),
        "summary": (hypothesis.splitlines()[0])[:500],
        "status": Skeleton.Status.DRAFT,
        "applicability": draft_conditions(_goal_probe(change, spec), _facts(change)),
        "applicability_prose": f"Worked on {change.target.name}, where it made {where} "
                               f"{gain:.2f}x better. Say when else it applies before "
                               "promoting it.",
        "transformation": f"{change.title}\n\n{hypothesis}\n\nThe diff is change "
                          f"{change.pk}'s (head {change.head_commit[:10]}).",
        "provenance": f"change #{change.pk}", "proposed_from": change,
    }


def _free_slug(change: Change) -> str:
    """'change-12-fuse-the-v-tiles', unique: a person may have taken the name already."""
    slug = f"change-{change.pk}-{slugify(change.title)}"[:MAX_SLUG].rstrip("-")
    if Skeleton.objects.filter(slug=slug).exists():
        slug = f"change-{change.pk}-draft-{timezone.now():%Y%m%d%H%M%S}"
    return slug


def _goal_probe(change: Change, spec: Mapping[str, Any]) -> Probe | None:
    """The goal's probe as the manifest at the change's base declares it (None if unread)."""
    if not spec.get("probe"):
        return None
    try:
        manifest = target_manifest_at(target=change.target, commit=change.base_commit)
    except (DomainError, ManifestError, gitops.GitError):
        return None
    return manifest.probe(spec["probe"])


def _facts(change: Change) -> list[Fact]:
    experiment = change.experiment
    if experiment is None:
        return []
    return measured_facts([(experiment.pk, experiment.feedback or {})])
