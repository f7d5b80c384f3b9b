"""Submitting a change, deciding on it, merging it."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AnonymousUser, User
from django.db import transaction
from django.utils import timezone

from infraops import gitops
from infraops.errors import DomainError
from infraops.models import Target
from infraops.roles import REVIEWER, has_role
from infraops.services.audit import audit_record
from reviews import risk
from reviews.models import Change, ReviewDecision

MERGE_AUTHOR = ("InfraOps", "infraops@localhost")


def change_submit(
    *, target: Target, title: str, hypothesis: str, evidence: dict[str, Any], base_commit: str,
    head_commit: str, author_label: str, requested_by: User | None,
    criteria_passed: bool,
) -> Change:
    """Record the diff base..head with its risk findings. A change with no risky line whose
    criteria all passed merges at once; every other change waits in the review queue."""
    try:
        diff = gitops.diff(target.clone_path, base_commit, head_commit)
    except gitops.GitError as exc:
        raise DomainError(f"The change's diff cannot be computed: {exc}") from None
    if not diff.strip():
        raise DomainError("The change is empty: the candidate equals its base.")
    manifest = target.manifest()
    rules = risk.BUILTIN_RULES + (risk.rules_from_manifest(manifest.risk) if manifest else ())
    findings = [f.as_dict() for f in risk.classify(diff, rules)]
    with transaction.atomic():
        change = Change.objects.create(
            target=target, title=title[:300], hypothesis=hypothesis, evidence=evidence,
            base_commit=base_commit, head_commit=head_commit, diff=diff,
            diff_sha256=Change.hash_diff(diff), risk=findings, criteria_passed=criteria_passed,
            author_label=author_label, requested_by=requested_by,
        )
        audit_record(actor=None, actor_label=author_label, action="change.submit", obj=change,
                     data={"risk": change.risk_categories, "criteria_passed": criteria_passed})
        if not change.needs_review:
            change_merge(change=change, actor=None)
            change.refresh_from_db()
    return change


def review_decide(
    *, change: Change, reviewer: User | AnonymousUser, decision: str, comment: str = ""
) -> ReviewDecision:
    """A reviewer decides on a change awaiting review; an approval merges it.

    Precondition (checked under the change's row lock): the change awaits review, the
    reviewer has the reviewer role and did not start the run that wrote it.
    """
    if not has_role(reviewer, REVIEWER):
        raise DomainError("Only a reviewer can decide on a change.")
    if decision not in ReviewDecision.Decision.values:
        raise DomainError(f"Unknown decision {decision!r}.")
    with transaction.atomic():
        locked = Change.objects.select_for_update().get(pk=change.pk)
        if locked.status != Change.Status.PENDING_REVIEW:
            raise DomainError(f"This change is {locked.get_status_display()}: it was already "
                              "decided, so nothing was recorded.")
        if locked.requested_by_id == reviewer.pk:
            raise DomainError("You started the run that wrote this change: another reviewer "
                              "must decide on it.")
        made = ReviewDecision.objects.create(
            change=locked, reviewer=reviewer, decision=decision, comment=comment,
            diff_sha256=locked.diff_sha256, base_commit=locked.base_commit,
        )
        status = {
            ReviewDecision.Decision.APPROVE: Change.Status.APPROVED,
            ReviewDecision.Decision.REJECT: Change.Status.REJECTED,
            ReviewDecision.Decision.REQUEST_CHANGES: Change.Status.CHANGES_REQUESTED,
        }[ReviewDecision.Decision(decision)]
        Change.objects.filter(pk=locked.pk).update(status=status)
        audit_record(actor=reviewer, action=f"change.{decision}", obj=locked,
                     data={"diff_sha256": locked.diff_sha256, "comment": comment})
        if status == Change.Status.APPROVED:
            locked.status = status
            change_merge(change=locked, actor=reviewer)
    change.refresh_from_db()
    return made


def change_merge(*, change: Change, actor: User | AnonymousUser | None) -> Change:
    """Merge an approved (or auto-mergeable) change into the target's base branch.

    Runs in the caller's transaction with the change row locked. Refuses when the diff no
    longer matches the approval, or when the base moved since the change was verified.
    """
    locked = Change.objects.select_for_update().get(pk=change.pk)
    target = locked.target
    if locked.status == Change.Status.MERGED:
        raise DomainError("This change is already merged.")
    if locked.needs_review:
        approval = locked.decisions.filter(decision=ReviewDecision.Decision.APPROVE).last()
        if approval is None or not approval.still_valid or locked.status != Change.Status.APPROVED:
            raise DomainError("This change needs a valid approval of its current diff to merge.")
    repo = target.clone_path
    current = gitops.diff(repo, locked.base_commit, locked.head_commit)
    if Change.hash_diff(current) != locked.diff_sha256:
        raise DomainError("The diff changed since it was reviewed: the approval is void.")
    tip = gitops.rev_parse(repo, f"refs/heads/{target.base_branch}")
    if tip != locked.base_commit:
        return _merge_failed(locked, actor, f"{target.base_branch} moved from "
                             f"{locked.base_commit[:10]} to {tip[:10]} since this change was "
                             "verified: re-run its experiments on the new base.")
    try:
        merged = gitops.merge(
            repo, branch=target.base_branch, commit=locked.head_commit,
            expected_base=locked.base_commit, message=f"InfraOps: {locked.title}\n\n"
            f"Change {locked.pk}, {locked.author_label}.",
            author_name=MERGE_AUTHOR[0], author_email=MERGE_AUTHOR[1],
        )
    except gitops.GitError as exc:
        return _merge_failed(locked, actor, str(exc))
    if target.push_on_merge:
        try:
            gitops.push(repo, "origin", target.base_branch)
        except gitops.GitError as exc:
            # Take the merge back, so the clone never holds what the origin refused.
            gitops.branch_move(repo, target.base_branch, new=tip, old=merged)
            return _merge_failed(locked, actor, f"the origin refused the push: {exc}")
    Change.objects.filter(pk=locked.pk).update(
        status=Change.Status.MERGED, merged_commit=merged, merged_at=timezone.now(), merge_error=""
    )
    audit_record(actor=actor, actor_label="" if actor else "auto-merge", action="change.merge",
                 obj=locked, data={"commit": merged, "branch": target.base_branch})
    locked.refresh_from_db()
    return locked


def _merge_failed(
    change: Change, actor: User | AnonymousUser | None, reason: str
) -> Change:
    Change.objects.filter(pk=change.pk).update(status=Change.Status.MERGE_FAILED,
                                               merge_error=reason)
    audit_record(actor=actor, actor_label="" if actor else "auto-merge",
                 action="change.merge_failed", obj=change, data={"reason": reason})
    change.refresh_from_db()
    return change
