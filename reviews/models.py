"""A change the agent proposes, and the human decisions on it."""

from __future__ import annotations

import hashlib

from django.conf import settings
from django.db import models

from infraops.models import Target


class ChangeQuerySet(models.QuerySet["Change"]):
    def awaiting_review(self) -> ChangeQuerySet:
        return self.filter(status=Change.Status.PENDING_REVIEW)


class Change(models.Model):
    """A diff (base_commit..head_commit on the target) with its hypothesis and evidence."""

    class Status(models.TextChoices):
        PENDING_REVIEW = "pending_review", "awaiting review"
        CHANGES_REQUESTED = "changes_requested", "changes requested"
        APPROVED = "approved", "approved"
        REJECTED = "rejected", "rejected"
        MERGED = "merged", "merged"
        MERGE_FAILED = "merge_failed", "merge failed"

    target = models.ForeignKey(Target, on_delete=models.CASCADE, related_name="changes")
    title = models.CharField(max_length=300)
    hypothesis = models.TextField()
    evidence = models.JSONField(default=dict, blank=True)
    base_commit = models.CharField(max_length=40)
    head_commit = models.CharField(max_length=40)
    diff = models.TextField()
    diff_sha256 = models.CharField(max_length=64)
    risk = models.JSONField(default=list, blank=True, help_text="Findings of reviews.risk.")
    criteria_passed = models.BooleanField(default=False)
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

    objects = ChangeQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"change {self.pk}: {self.title}"

    @staticmethod
    def hash_diff(diff: str) -> str:
        return hashlib.sha256(diff.encode()).hexdigest()

    @property
    def risk_categories(self) -> list[str]:
        return sorted({finding["category"] for finding in self.risk})

    @property
    def needs_review(self) -> bool:
        return bool(self.risk) or not self.criteria_passed


class ReviewDecision(models.Model):
    """A reviewer's decision, bound to the exact diff and base it was made on."""

    class Decision(models.TextChoices):
        APPROVE = "approve"
        REJECT = "reject"
        REQUEST_CHANGES = "request_changes", "request changes"

    change = models.ForeignKey(Change, on_delete=models.CASCADE, related_name="decisions")
    reviewer = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    decision = models.CharField(max_length=20, choices=Decision.choices)
    comment = models.TextField(blank=True)
    diff_sha256 = models.CharField(max_length=64)
    base_commit = models.CharField(max_length=40)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at"]

    def __str__(self) -> str:
        return f"{self.decision} on change {self.change_id}"

    @property
    def still_valid(self) -> bool:
        """An approval covers only the diff and base it saw."""
        return (self.diff_sha256 == self.change.diff_sha256
                and self.base_commit == self.change.base_commit)
