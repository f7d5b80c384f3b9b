"""Reviewers' decisions and line comments; who may make them. A refusal is audited."""

from __future__ import annotations

import logging
from datetime import timedelta
from functools import partial
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from infraops import gitops
from infraops.access import has_target_role, target_roles
from infraops.dbretry import TRANSIENT, retried
from infraops.errors import DomainError, Forbidden
from infraops.grants import reviewer_grants, separation_problem
from infraops.roles import REVIEWER
from infraops.services.audit import audit_record
from reviews.live import queue_changed, reviewer_classes
from reviews.models import Change, ReviewComment, ReviewDecision
from reviews.services.merge import change_advance, change_merge_prepare
from reviews.signals import (
    change_decided_after_commit,
    changes_requested_after_commit,
    changes_requested_send,
)

log = logging.getLogger(__name__)

MAX_COMMENT = 10_000
# A reviewer waits on the merge after their decision: a few quick reconnects (under a
# second), then beat's changes_reap finishes it (every 15 s).
MERGE_TRIES_IN_REQUEST = 3
DECIDABLE = (Change.Status.PENDING_REVIEW,)
RETRYABLE = (Change.Status.MERGE_FAILED, Change.Status.APPROVED)
_STATUS_AFTER = {
    ReviewDecision.Decision.APPROVE: Change.Status.APPROVED,
    ReviewDecision.Decision.REJECT: Change.Status.REJECTED,
    ReviewDecision.Decision.REQUEST_CHANGES: Change.Status.CHANGES_REQUESTED,
}


def decision_denial(user: User, change: Change) -> str | None:
    """Why `user` may not decide on `change`, in a sentence; None when they may. The page's
    `can_decide` and the service use this one rule."""
    if not user.is_authenticated:
        return "Sign in as a reviewer to decide on a change."
    roles = target_roles(user, change.target_id)
    if not roles:
        return "This change's target is not one of yours: an admin adds you to it."
    if REVIEWER not in roles:
        return "Only a reviewer can decide on a change."
    if change.requested_by_id == user.pk:
        return "You started the run that wrote this change: another reviewer must decide on it."
    separation = separation_problem(user, change.target_id, change.requested_by)
    if separation is not None:
        return separation
    classes = reviewer_classes(user)
    uncovered = sorted(set(change.risk_classes) - set(classes)) if classes else []
    if uncovered and not getattr(user, "is_superuser", False):
        return (f"This change is {', '.join(uncovered)}; you review {', '.join(classes)}: a "
                "reviewer of that class decides.")
    return None


def decider_rights(user: User, change: Change) -> list[dict[str, Any]]:
    """Who granted the user's reviewer rights on the change's target, and when: recorded with
    each decision, and shown on the change page beside it."""
    return [grant.as_record() for grant in reviewer_grants(user, change.target_id)]


def change_refusal(user: User, change: Change, action: str,
                   reason: str) -> Forbidden:
    """The audit row of a refused attempt, and the error that says why."""
    audit_record(actor=user, actor_label="" if user.is_authenticated else "anonymous",
                 action=f"change.{action}_denied", obj=change,
                 data={"reason": reason,
                       "roles": sorted(target_roles(user, change.target_id))})
    return Forbidden(reason)


def review_decide(
    *, change: Change, reviewer: User, decision: str, comment: str = "",
    diff_sha256: str | None = None, override_reason: str = "",
) -> ReviewDecision:
    """A reviewer decides on a change awaiting review; an approval merges it.

    Precondition (re-checked under the change's row lock): the change awaits review; the
    reviewer may decide on it (decision_denial); `diff_sha256`, the diff the reviewer saw,
    is the change's; an approval of a change with failing evidence carries an
    `override_reason` (the checks it goes over are recorded with it). Call outside a
    transaction: an approval records the decision and the merge intent first, then git
    moves (reviews.services.merge)."""
    if decision not in ReviewDecision.Decision.values:
        raise DomainError(f"Unknown decision {decision!r}: approve, reject or request changes.")
    if len(comment) > MAX_COMMENT:
        raise DomainError(f"The comment is {len(comment):,} characters; at most "
                          f"{MAX_COMMENT:,} are kept. Nothing was recorded.")
    denial = decision_denial(reviewer, change)
    if denial is not None:
        raise change_refusal(reviewer, change, decision, denial)
    assert isinstance(reviewer, User)
    with transaction.atomic():
        locked = Change.objects.select_for_update().select_related("target").get(pk=change.pk)
        if locked.status not in DECIDABLE:
            raise DomainError(f"This change is {locked.get_status_display()}: it was already "
                              "decided, so nothing was recorded.")
        if diff_sha256 is not None and diff_sha256 != locked.diff_sha256:
            raise DomainError("The diff changed since you opened it: reload the page, read it "
                              "again and decide on what it is now. Nothing was recorded.")
        over: list[str] = []
        if decision == ReviewDecision.Decision.APPROVE:
            _check_diff_unchanged(locked)
            over = _overridden(locked, override_reason)
        rights = decider_rights(reviewer, locked)
        made = ReviewDecision.objects.create(
            change=locked, reviewer=reviewer, decision=decision, comment=comment,
            diff_sha256=locked.diff_sha256, base_commit=locked.base_commit,
            overridden_checks=over, override_reason=override_reason.strip() if over else "",
            rights=rights,
        )
        status = _STATUS_AFTER[ReviewDecision.Decision(decision)]
        fields: dict[str, object] = {"status": status}
        if status == Change.Status.APPROVED:
            fields["merge_intent"] = {"actor": reviewer.pk, "actor_label": reviewer.get_username(),
                                      "decision": made.pk}
        Change.objects.filter(pk=locked.pk).update(**fields)
        audit_record(actor=reviewer, action=f"change.{decision}", obj=locked,
                     data={"diff_sha256": locked.diff_sha256, "base": locked.base_commit,
                           "comment": comment, "rights": rights}
                     | ({"override": {"checks": over, "reason": made.override_reason}}
                        if over else {}))
        if status == Change.Status.REJECTED:
            change_decided_after_commit(locked.pk, Change.Status.REJECTED)
        if status == Change.Status.CHANGES_REQUESTED:
            changes_requested_after_commit(made.pk)
        if status == Change.Status.APPROVED:
            locked.refresh_from_db()
            try:
                change_merge_prepare(change=locked)
            except gitops.GitError as exc:
                raise DomainError(f"The merge cannot be prepared, so nothing was recorded: "
                                  f"{exc}") from None
        queue_changed()
    merge_after_decision(change)
    return made


def merge_after_decision(change: Change) -> bool:
    """Take a decided change as far as it goes now and refresh `change`; False when the
    database connection kept failing. The decision is committed by then and every merge step
    is idempotent (reviews.services.merge), so a dropped connection loses nothing: beat's
    changes_reap finishes the merge. Issue 28: the reviewer saw a 503, as if nothing had been
    recorded, while the merge completed 15 s later."""
    try:
        retried(partial(change_advance, change_id=change.pk), what=f"change {change.pk} merge",
                tries=MERGE_TRIES_IN_REQUEST)
        retried(change.refresh_from_db, what=f"change {change.pk} read",
                tries=MERGE_TRIES_IN_REQUEST)
    except TRANSIENT as exc:
        log.warning("change %s: decided, and the database failed while merging (%s); the "
                    "reaper finishes the merge", change.pk, type(exc).__name__)
        return False
    return True


def _overridden(change: Change, reason: str) -> list[str]:
    """The titles of the failing checks an approval goes over; refused without a reason.
    Issue 27: a change whose acceptance criterion failed merged with one click and no mark."""
    over = [str(check.get("title", check.get("name", "?")))
            for check in change.overridable_checks]
    if over and not reason.strip():
        raise DomainError(f"{len(over)} check{'s' * (len(over) != 1)} failing: "
                          f"{'; '.join(over)}. Approving merges over failing evidence: give "
                          "your reason in the override step. Nothing was recorded.")
    return over


def _check_diff_unchanged(change: Change) -> None:
    """The stored diff is what git has between base and head (TOCTOU: nothing swapped it)."""
    try:
        current = gitops.diff(change.target.clone_path, change.base_commit, change.head_commit)
    except gitops.GitError as exc:
        raise DomainError(f"The change's commits cannot be read: {exc}") from None
    if Change.hash_diff(current) != change.diff_sha256:
        raise DomainError("The diff changed since it was reviewed: the approval is void. "
                          "Nothing was recorded.")


def change_merge_request(*, change: Change, user: User) -> Change:
    """Try the merge of an approved change again (after a refused push, say). Needs a valid
    approval of the current diff and a person who may decide on the change."""
    denial = decision_denial(user, change)
    if denial is not None:
        raise change_refusal(user, change, "merge", denial)
    with transaction.atomic():
        locked = Change.objects.select_for_update().get(pk=change.pk)
        if locked.status == Change.Status.MERGED:
            raise DomainError("This change is already merged.")
        if locked.status not in RETRYABLE:
            raise DomainError(f"This change is {locked.get_status_display()}: there is no "
                              "merge to try again.")
        if locked.valid_approval() is None:
            raise DomainError("This change needs a valid approval of its current diff to merge.")
        Change.objects.filter(pk=locked.pk).update(status=Change.Status.APPROVED)
        audit_record(actor=user, action="change.merge_retry", obj=locked)
    return change_advance(change_id=change.pk)


# A request for changes not delivered this long after it was made was lost with the process
# that committed it (before its after-commit send, or in the middle of it).
UNDELIVERED_AFTER = timedelta(minutes=5)


def requested_changes_reap() -> list[int]:
    """Deliver the requests for changes a killed process left undelivered: never sent, or
    claimed and never finished. Beat runs it every minute; returns the decisions sent."""
    cutoff = timezone.now() - UNDELIVERED_AFTER
    lost = ReviewDecision.objects.filter(
        decision=ReviewDecision.Decision.REQUEST_CHANGES, created_at__lt=cutoff).filter(
        Q(delivery={}) | Q(delivery__outcome="delivering",
                           delivery__since__lt=cutoff.isoformat()))
    sent = []
    for decision_id, delivery in lost.values_list("pk", "delivery")[:100]:
        if ReviewDecision.objects.filter(pk=decision_id, delivery=delivery).update(delivery={}):
            changes_requested_send(decision_id)
            sent.append(decision_id)
    return sent


def change_comment(*, change: Change, author: User, path: str, line: int,
                   side: str, text: str) -> ReviewComment:
    """A reviewer's comment on one line of the diff; the agent reads it at its next step."""
    if not has_target_role(author, change.target_id, REVIEWER):
        raise change_refusal(author, change, "comment", "Only a reviewer can comment on a change.")
    text = text.strip()
    if not text:
        raise DomainError("The comment is empty.")
    if len(text) > MAX_COMMENT:
        raise DomainError(f"The comment is {len(text):,} characters; at most {MAX_COMMENT:,}.")
    if (path, line, side) not in diff_lines(change):
        raise DomainError(f"{path} line {line} is not a line of this diff.")
    with transaction.atomic():
        made = ReviewComment.objects.create(change=change, author=author, path=path, line=line,
                                            side=side, text=text, diff_sha256=change.diff_sha256)
        audit_record(actor=author, action="change.comment", obj=change,
                     data={"path": path, "line": line, "comment": made.pk})
    return made


def diff_lines(change: Change) -> set[tuple[str, int, str]]:
    """(path, line, side) of every line shown in the change's diff."""
    from reviews.diff_render import render_diff

    lines: set[tuple[str, int, str]] = set()
    for file in render_diff(change.diff, []):
        for row in file.rows:
            if row.new is not None and row.kind != "removed":
                lines.add((file.path, row.new, "new"))
            if row.old is not None and row.kind == "removed":
                lines.add((file.path, row.old, "old"))
    return lines
