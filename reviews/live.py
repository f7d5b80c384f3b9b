"""The review queue's live count: what a user's navigation shows, and the notice that it moved.

The notice says only "the queue changed"; every socket re-counts from the database for its own
user, so a dropped notice costs latency, never a wrong number (the next page load is right).
"""

from __future__ import annotations

from django.db import connections, router
from django.http import HttpRequest

from infraops.access import is_superuser, scoped
from infraops.live import notify
from infraops.roles import AnyUser
from reviews.models import Change, ChangeQuerySet, ReviewerProfile

REVIEWS_GROUP = "reviews"


def queue_changed() -> None:
    """Call where a change is created or changes status: every open page re-counts after the
    commit (nothing is sent if the transaction rolls back)."""
    notify(REVIEWS_GROUP, {"type": "reviews.changed"})


def reviewer_classes(user: AnyUser) -> list[str]:
    """The risk classes assigned to the user; empty for a generalist or a non-reviewer.

    The reverse one-to-one caches its answer (a missing profile too) on the user instance,
    so the view and the context processor of one request share one query.
    """
    if not user.is_authenticated:
        return []
    try:
        return list(user.reviewer_profile.risk_classes)
    except ReviewerProfile.DoesNotExist:
        return []


def assigned_classes(user_id: int) -> list[str]:
    """The user's classes read afresh (a long-lived socket must see a reassignment)."""
    found = (ReviewerProfile.objects.filter(user_id=user_id)
             .values_list("risk_classes", flat=True).first())
    return list(found or [])


def awaiting_for(user: AnyUser) -> ChangeQuerySet:
    """What waits for this user: changes awaiting review of their classes (or every class)
    on the targets they see."""
    return scoped(awaiting_for_classes(reviewer_classes(user)), user)


def awaiting_for_classes(classes: list[str]) -> ChangeQuerySet:
    changes = Change.objects.awaiting_review()
    return changes.for_classes(classes) if classes else changes


# awaiting_for(...).count() as one literal statement (bandit, B608): every page's navigation
# counts, and building the ORM's count query cost more of the web process's CPU than any other
# query of the dashboard (bench/load.py). tests/reviews/test_queue.py holds it to the ORM's
# answer for superusers, members, non-members and every mix of classes.
_COUNT_AWAITING = """
SELECT count(*) FROM reviews_change c
WHERE c.status = %(status)s
  AND (%(every_target)s OR c.target_id IN (
       SELECT m.target_id FROM infraops_targetmembership m WHERE m.user_id = %(user)s))
  AND (cardinality(%(classes)s::varchar[]) = 0 OR c.risk_classes && %(classes)s::varchar[])
"""


def count_awaiting(user: AnyUser, classes: list[str]) -> int:
    """How many changes await review of these classes (every class for []) on the targets
    the user sees: `awaiting_for_classes(classes)` scoped to the user, counted."""
    if not user.is_authenticated:
        return 0
    with connections[router.db_for_read(Change)].cursor() as cursor:
        cursor.execute(_COUNT_AWAITING, {
            "status": Change.Status.PENDING_REVIEW.value, "every_target": is_superuser(user),
            "user": user.pk, "classes": list(classes)})
        row = cursor.fetchone()
    return int(row[0]) if row else 0


def awaiting_count(request: HttpRequest, classes: list[str]) -> int:
    """How many changes await review of these classes (every class for []) on the targets
    the user sees, counted once per request: the dashboard's line and a generalist's
    navigation count are one query."""
    memo: dict[tuple[str, ...], int] = request.__dict__.setdefault("_infraops_awaiting", {})
    key = tuple(sorted(classes))
    if key not in memo:
        memo[key] = count_awaiting(request.user, list(key))
    return memo[key]
