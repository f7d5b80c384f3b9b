"""The skeleton library: reusable optimisation techniques (docs/product.md, "Skeleton"), the
evidence that each works, and what became of every time an agent run applied one.

Models of the core, imported by infraops.models. The library is read by every layer (the
agent's tools, the merge's outcome, the pages), so it lives here; its evidence and uses name
a change and a run by relation only (``"reviews.Change"``, ``"agents.AgentRun"``): the core
still imports neither app. When a skeleton applies is skeletons/applicability.py (pure).
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import median

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models

from infraops.feedback.stats import median_interval
from skeletons.applicability import Predicate, predicate_problems, validate_predicates


class SkeletonQuerySet(models.QuerySet["Skeleton"]):
    def visible_to(self, target_ids: list[int] | None) -> SkeletonQuerySet:
        """What a person who sees these targets (None: every target) may read. A draft
        proposed from a change quotes its title and hypothesis, so it is seen only by who
        sees that change's target, until a person reviews it into the library."""
        if target_ids is None:
            return self
        return self.exclude(models.Q(status=Skeleton.Status.DRAFT)
                            & models.Q(proposed_from__isnull=False)
                            & ~models.Q(proposed_from__target_id__in=target_ids))

    def search(self, text: str) -> SkeletonQuerySet:
        """Skeletons whose name, summary, conditions in prose or transformation hold `text`."""
        if not text.strip():
            return self
        words = text.strip()
        return self.filter(models.Q(name__icontains=words) | models.Q(summary__icontains=words)
                           | models.Q(applicability_prose__icontains=words)
                           | models.Q(transformation__icontains=words))

    def with_field(self, field: str) -> SkeletonQuerySet:
        """Skeletons with a condition on `field` (JSONB containment: one list element that
        holds {"field": field})."""
        return self.filter(applicability__contains=[{"field": field}])


class Skeleton(models.Model):
    """One technique: when it applies (predicates and prose), what to change, what it costs,
    where it came from. Promoted by people: draft -> reviewed -> trusted."""

    class Status(models.TextChoices):
        DRAFT = "draft", "draft"
        REVIEWED = "reviewed", "reviewed"
        TRUSTED = "trusted", "trusted"

    name = models.CharField(max_length=200)
    slug = models.SlugField(max_length=80, unique=True)
    summary = models.CharField(max_length=500, help_text="The technique in a sentence or two.")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.DRAFT)
    applicability = models.JSONField(
        "conditions", default=list, blank=True,
        help_text='Checkable conditions over the probe\'s metadata and measured facts, a JSON '
                  'list: [{"field": "dtype", "op": "in", "value": ["fp32", "tf32"]}, '
                  '{"field": "bottleneck", "op": "eq", "value": "precision"}, {"field": '
                  '"seq_len", "op": ">=", "value": 1024}]. Ops: eq, ne, in, not_in, <, <=, '
                  '>, >=.')
    applicability_prose = models.TextField(
        "conditions in words", blank=True,
        help_text="What the predicates cannot say: when it applies, and when it does not.")
    transformation = models.TextField(help_text="What to change, with a sketch of the diff.")
    resource_constraints = models.TextField(
        blank=True, help_text="What it costs or needs: registers, memory, occupancy, hardware.")
    provenance = models.CharField(
        max_length=300, help_text="The public project or the change it was distilled from.")
    provenance_url = models.URLField("provenance link", blank=True)
    proposed_from = models.OneToOneField(
        "reviews.Change", null=True, blank=True, on_delete=models.PROTECT,
        related_name="proposed_skeleton",
        help_text="The merged change this draft was proposed from (one draft per change).")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")
    promoted_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                    on_delete=models.SET_NULL, related_name="+")
    promoted_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = SkeletonQuerySet.as_manager()

    class Meta:
        db_table = "infraops_skeleton"  # made under the core app; the table kept its name
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        problems = predicate_problems(self.applicability)
        if problems:
            raise ValidationError({"applicability": problems})

    def predicates(self) -> list[Predicate]:
        """The conditions as predicates (a stored list that no longer validates gives none:
        clean() refuses it on the next save, and the page shows the raw conditions)."""
        try:
            return validate_predicates(self.applicability)
        except ValueError:
            return []

    @classmethod
    def status_after(cls, status: str) -> str | None:
        """The status a promotion from `status` leads to; None after trusted (or for a
        status that is none of the three)."""
        order: list[str] = list(cls.Status.values)
        if status not in order or status == order[-1]:
            return None
        return order[order.index(status) + 1]

    @property
    def next_status(self) -> str | None:
        return self.status_after(self.status)

    def usage(self) -> UsageStats:
        return usage_of([self.pk]).get(self.pk) or UsageStats.of([])


class SkeletonEvidence(models.Model):
    """An experiment or change that shows the skeleton at work: an accepted use's change and
    its evidence experiment, or the change a draft was proposed from."""

    skeleton = models.ForeignKey(Skeleton, on_delete=models.CASCADE, related_name="evidence")
    experiment = models.ForeignKey("infraops.Experiment", null=True, blank=True,
                                   on_delete=models.PROTECT, related_name="+")
    change = models.ForeignKey("reviews.Change", null=True, blank=True,
                               on_delete=models.PROTECT, related_name="+")
    note = models.CharField(max_length=300, blank=True)
    added_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "infraops_skeletonevidence"
        ordering = ["skeleton", "-added_at", "-id"]
        verbose_name_plural = "skeleton evidence"
        constraints = [
            models.CheckConstraint(
                condition=models.Q(experiment__isnull=False) | models.Q(change__isnull=False),
                name="skeleton_evidence_names_something"),
            models.UniqueConstraint(fields=["skeleton", "experiment", "change"],
                                    nulls_distinct=False, name="skeleton_evidence_once"),
        ]

    def __str__(self) -> str:
        return f"evidence of {self.skeleton_id}"


class SkeletonUse(models.Model):
    """A run applied the skeleton (the agent said so with skeleton_apply); the change it
    submitted then decides the outcome: accepted (merged, with the verified gain when the
    goal's metric improved) or rejected."""

    class Outcome(models.TextChoices):
        APPLIED = "applied", "applied, not yet decided"
        ACCEPTED = "accepted", "accepted (merged)"
        REJECTED = "rejected", "rejected"

    skeleton = models.ForeignKey(Skeleton, on_delete=models.PROTECT, related_name="uses")
    run = models.ForeignKey("agents.AgentRun", on_delete=models.PROTECT,
                            related_name="skeleton_uses")
    change = models.ForeignKey(
        "reviews.Change", null=True, blank=True, on_delete=models.PROTECT,
        related_name="skeleton_uses",
        help_text="The run's change that carries this use (set when the run submits one).")
    note = models.TextField(blank=True, help_text="What the agent said it applied, and where.")
    outcome = models.CharField(max_length=10, choices=Outcome.choices, default=Outcome.APPLIED)
    gain = models.FloatField(
        null=True, blank=True,
        help_text="Times better on the goal's metric (1.71 = 1.71x), from the change's evidence; "
                  "empty when no gain was verified.")
    applied_at = models.DateTimeField(auto_now_add=True)
    decided_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "infraops_skeletonuse"
        ordering = ["-applied_at", "-id"]
        constraints = [
            # One open use of a skeleton per run: applying it again updates the note.
            models.UniqueConstraint(fields=["skeleton", "run"],
                                    condition=models.Q(outcome="applied"),
                                    name="skeleton_use_open_once_per_run"),
        ]

    def __str__(self) -> str:
        return f"{self.skeleton_id} in run {self.run_id}: {self.outcome}"


@dataclass(frozen=True)
class UsageStats:
    """What the uses of a skeleton came to. The gain's median and 95% interval are over the
    accepted uses with a verified gain (infraops.feedback.stats.median_interval: none below
    three)."""

    applied: int
    accepted: int
    rejected: int
    gains: tuple[float, ...]
    median_gain: float | None
    low: float | None
    high: float | None

    @classmethod
    def of(cls, rows: list[tuple[str, float | None]]) -> UsageStats:
        """From (outcome, gain) pairs, one per use."""
        accepted = SkeletonUse.Outcome.ACCEPTED
        gains = tuple(gain for outcome, gain in rows if outcome == accepted and gain is not None)
        summary = median_interval(gains)
        return cls(
            applied=len(rows),
            accepted=sum(1 for outcome, _ in rows if outcome == accepted),
            rejected=sum(1 for outcome, _ in rows if outcome == SkeletonUse.Outcome.REJECTED),
            gains=gains, median_gain=median(gains) if gains else None,
            low=summary[1] if summary else None,
            high=summary[2] if summary else None)

    @property
    def open(self) -> int:
        return self.applied - self.accepted - self.rejected

    def describe(self) -> str:
        """'applied 5 times: 3 accepted, 1 rejected, 1 open; median gain 1.52x (95% CI
        1.31x-1.71x, 3 gains)'."""
        if not self.applied:
            return "not applied yet"
        said = (f"applied {self.applied} time{'s' if self.applied != 1 else ''}: "
                f"{self.accepted} accepted, {self.rejected} rejected, {self.open} open")
        if self.median_gain is None:
            return said + "; no verified gain yet"
        if self.low is None or self.high is None:
            return (said + f"; gain {self.median_gain:.2f}x from {len(self.gains)} verified "
                    "use(s), too few for an interval")
        return (said + f"; median gain {self.median_gain:.2f}x (95% CI {self.low:.2f}x-"
                f"{self.high:.2f}x, {len(self.gains)} gains)")


def usage_of(skeleton_ids: list[int]) -> dict[int, UsageStats]:
    """The usage of each of these skeletons, in one query (a list page shows many)."""
    rows: dict[int, list[tuple[str, float | None]]] = {pk: [] for pk in skeleton_ids}
    for skeleton_id, outcome, gain in SkeletonUse.objects.filter(
            skeleton_id__in=skeleton_ids).values_list("skeleton_id", "outcome", "gain"):
        rows[skeleton_id].append((outcome, gain))
    return {pk: UsageStats.of(found) for pk, found in rows.items()}
