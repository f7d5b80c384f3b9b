"""A change the agent proposes, and the human decisions on it."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import GinIndex
from django.db import models
from django.utils.dateparse import parse_datetime

from infraops.models import Experiment, Goal, GoalVersion, Target
from reviews import gate

RISK_CLASSES = ("numerics", "concurrency", "production", "unclassified")


class ChangeQuerySet(models.QuerySet["Change"]):
    def awaiting_review(self) -> ChangeQuerySet:
        return self.filter(status=Change.Status.PENDING_REVIEW)

    def for_classes(self, classes: list[str]) -> ChangeQuerySet:
        """Changes with at least one of these risk classes."""
        return self.filter(risk_classes__overlap=classes)


class Change(models.Model):
    """A diff (base_commit..head_commit on the target) with its hypothesis and evidence."""

    class Status(models.TextChoices):
        PENDING_REVIEW = "pending_review", "awaiting review"
        CHANGES_REQUESTED = "changes_requested", "changes requested"
        APPROVED = "approved", "approved"
        REVERIFYING = "reverifying", "re-verifying on the moved base"
        MERGING = "merging", "merging"
        REJECTED = "rejected", "rejected"
        MERGED = "merged", "merged"
        CONFLICT = "conflict", "conflicts with the base"
        MERGE_FAILED = "merge_failed", "merge failed"

    target = models.ForeignKey(Target, on_delete=models.PROTECT, related_name="changes")
    goal = models.ForeignKey(Goal, null=True, blank=True, on_delete=models.PROTECT,
                             related_name="changes")
    goal_version = models.ForeignKey(
        GoalVersion, null=True, blank=True, on_delete=models.PROTECT, related_name="changes",
        help_text="The version the run pinned: its criteria and auto-merge setting decide.",
    )
    experiment = models.ForeignKey(
        Experiment, null=True, blank=True, on_delete=models.PROTECT, related_name="+",
        help_text="The evidence experiment: candidate = head, baseline = base.",
    )
    title = models.CharField(max_length=300)
    hypothesis = models.TextField()
    evidence = models.JSONField(default=dict, blank=True)
    base_commit = models.CharField(max_length=40)
    head_commit = models.CharField(max_length=40)
    diff = models.TextField()
    diff_sha256 = models.CharField(max_length=64)
    risk = models.JSONField(default=list, blank=True, help_text="Findings of reviews.risk.")
    risk_classes = ArrayField(models.CharField(max_length=20), default=list, blank=True)
    gate = models.JSONField(default=list, blank=True,
                            help_text="The merge gate's checks, as last evaluated (reviews.gate).")
    gate_passed = models.BooleanField(default=False)
    status = models.CharField(max_length=20, choices=Status.choices, default="pending_review")
    author_label = models.CharField(max_length=200, help_text="The agent run that wrote it.")
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.PROTECT, related_name="+",
        help_text="The person who started the run: never its reviewer.",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    merged_commit = models.CharField(max_length=40, blank=True)
    merged_at = models.DateTimeField(null=True, blank=True)
    merge_error = models.TextField(blank=True)
    # Set with status "merging", before git moves: what to merge, onto which tip, on whose
    # word. A restart finishes the merge from it and from git's state (reviews.merge).
    merge_intent = models.JSONField(default=dict, blank=True)
    reverify_experiment = models.ForeignKey(
        Experiment, null=True, blank=True, on_delete=models.PROTECT, related_name="+",
        help_text="When the base moved: the acceptance probes on the merged tree.",
    )

    objects = ChangeQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["status", "-created_at", "-id"], name="change_status_created"),
            models.Index(fields=["-created_at", "-id"], name="change_created"),
            models.Index(fields=["target", "status", "-created_at"], name="change_target_status"),
            models.Index(fields=["goal", "status", "-created_at"], name="change_goal_status"),
            GinIndex(fields=["risk_classes"], name="change_risk_classes"),
            # The nav count and "my queue": only what awaits review (a few % of all changes),
            # with its classes in the index (measured: 20-37 ms -> 2-5 ms at 100 000 changes).
            models.Index(fields=["-created_at", "-id"], include=["risk_classes"],
                         condition=models.Q(status="pending_review"),
                         name="change_pending_created"),
        ]

    def __str__(self) -> str:
        return f"change {self.pk}: {self.title}"

    @staticmethod
    def hash_diff(diff: str) -> str:
        return hashlib.sha256(diff.encode()).hexdigest()

    @property
    def risk_categories(self) -> list[str]:
        return sorted({finding["category"] for finding in self.risk})

    @property
    def checks(self) -> list[dict[str, object]]:
        """The stored checks, each with its ``state``: passed, review or failed."""
        return [check | {"state": gate.check_state(check)} for check in self.gate]

    @property
    def failing_checks(self) -> list[dict[str, object]]:
        """Checks whose evidence is bad: not the ones that only ask for a reviewer."""
        return [check for check in self.gate if gate.check_state(check) == gate.FAILED]

    @property
    def overridable_checks(self) -> list[dict[str, object]]:
        """Failing evidence an approval must name and give a reason for (reviews.services.
        decide): none without an evidence experiment, never a moved base."""
        if self.experiment_id is None:
            return []
        return [check for check in self.failing_checks if check.get("name") not in
                gate.NOT_OVERRIDES]

    @property
    def review_checks(self) -> list[dict[str, object]]:
        """Checks that ask for a reviewer (automatic merge off, risky or unread lines)."""
        return [check for check in self.gate if gate.check_state(check) == gate.REVIEW]

    @property
    def merged_over(self) -> list[str]:
        """The titles of the checks that were not green when the change merged."""
        over = self.merge_intent.get("over")
        if isinstance(over, list):
            return [str(title) for title in over]
        return [str(check.get("title", "?")) for check in self.gate if not check.get("passed")]

    @property
    def merged_by(self) -> str:
        return str(self.merge_intent.get("actor_label") or "auto-merge")

    def valid_approval(self, decisions: Sequence[ReviewDecision] | None = None,
                       ) -> ReviewDecision | None:
        """The latest approval, if it still covers this diff and base, and no later decision
        took it back. `decisions`: the change's decisions, already read (the change page
        lists them), else they are asked for."""
        if decisions is None:
            latest = self.decisions.order_by("-created_at", "-id").first()
        else:
            latest = max(decisions, key=lambda d: (d.created_at, d.pk), default=None)
        if latest is None or latest.decision != ReviewDecision.Decision.APPROVE:
            return None
        return latest if latest.still_valid else None


def approved_over_failing_checks() -> models.Exists:
    """For `.annotate(overridden=...)` of changes: a reviewer approved the change over failing
    evidence (the override step, issue 27). Every approval of a change faces the same failing
    evidence checks, so any one that named checks says it."""
    return models.Exists(ReviewDecision.objects.filter(
        change=models.OuterRef("pk"), decision=ReviewDecision.Decision.APPROVE)
        .exclude(overridden_checks=[]))


def grants_for_page(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Recorded grants (infraops.grants.Grant.as_record) with their moments as datetimes."""
    return [grant | {"granted_at": parse_datetime(grant["granted_at"])
                     if grant.get("granted_at") else None} for grant in records]


class ReviewDecision(models.Model):
    """A reviewer's decision, bound to the exact diff and base it was made on."""

    class Decision(models.TextChoices):
        APPROVE = "approve"
        REJECT = "reject"
        REQUEST_CHANGES = "request_changes", "request changes"

    change = models.ForeignKey(Change, on_delete=models.PROTECT, related_name="decisions")
    reviewer = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    decision = models.CharField(max_length=20, choices=Decision.choices)
    comment = models.TextField(blank=True)
    # An approval over failing evidence names what it went over and why (issue 27): the
    # titles of the failing checks the reviewer saw, and the reviewer's reason.
    overridden_checks = models.JSONField(default=list, blank=True)
    override_reason = models.TextField(blank=True)
    # Separation of duties (issue 27): who granted the reviewer's rights on the target, and
    # when, as they stood at the decision (infraops.grants.Grant.as_record).
    rights = models.JSONField(default=list, blank=True)
    # Where a request for changes went (reviews.signals.changes_requested): {"outcome":
    # "message" | "follow_up" | "undelivered", "run": id, "run_status": ..., "reason": ...},
    # written by the app that runs agents; empty while nothing answered yet.
    delivery = models.JSONField(default=dict, blank=True)
    diff_sha256 = models.CharField(max_length=64)
    base_commit = models.CharField(max_length=40)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at"]

    def __str__(self) -> str:
        return f"{self.decision} on change {self.change_id}"

    @property
    def rights_granted(self) -> list[dict[str, Any]]:
        return grants_for_page(self.rights)

    @property
    def still_valid(self) -> bool:
        """An approval covers only the diff and base it saw."""
        return (self.diff_sha256 == self.change.diff_sha256
                and self.base_commit == self.change.base_commit)


class ReviewComment(models.Model):
    """A reviewer's comment on one line of the diff; the agent reads it with path and line."""

    change = models.ForeignKey(Change, on_delete=models.PROTECT, related_name="comments")
    author = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT,
                               related_name="+")
    path = models.CharField(max_length=1000)
    line = models.PositiveIntegerField(help_text="Line in the new file (old file if removed).")
    side = models.CharField(max_length=3, choices=[("new", "new"), ("old", "old")],
                            default="new")
    text = models.TextField()
    diff_sha256 = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"comment on {self.path}:{self.line} of change {self.change_id}"


class ReviewerProfile(models.Model):
    """The risk classes a reviewer is assigned: "my queue" shows changes of these classes,
    and a reviewer with classes decides only on changes whose classes they all cover."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                                related_name="reviewer_profile")
    risk_classes = ArrayField(
        models.CharField(max_length=20, choices=[(c, c) for c in RISK_CLASSES]),
        default=list, blank=True,
        help_text="Empty: a generalist who may decide on every class.",
    )

    def __str__(self) -> str:
        return f"{self.user}: {', '.join(self.risk_classes) or 'every class'}"
