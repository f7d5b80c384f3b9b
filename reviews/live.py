"""The review queue's live count: what a user's navigation shows, and the notice that it moved.

The notice says only "the queue changed"; every socket re-counts from the database for its own
user, so a dropped notice costs latency, never a wrong number (the next page load is right).
"""

from __future__ import annotations

from django.contrib.auth.models import AnonymousUser, User
from django.http import HttpRequest

from infraops.access import scoped
from infraops.live import notify
from reviews.models import Change, ChangeQuerySet, ReviewerProfile

REVIEWS_GROUP = "reviews"


def queue_changed() -> None:
    """Call where a change is created or changes status: every open page re-counts after the
    commit (nothing is sent if the transaction rolls back)."""
    notify(REVIEWS_GROUP, {"type": "reviews.changed"})


def reviewer_classes(user: User | AnonymousUser) -> list[str]:
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


def awaiting_for(user: User | AnonymousUser) -> ChangeQuerySet:
    """What waits for this user: changes awaiting review of their classes (or every class)
    on the targets they see."""
    return scoped(awaiting_for_classes(reviewer_classes(user)), user)


def awaiting_for_classes(classes: list[str]) -> ChangeQuerySet:
    changes = Change.objects.awaiting_review()
    return changes.for_classes(classes) if classes else changes


def awaiting_count(request: HttpRequest, classes: list[str]) -> int:
    """How many changes await review of these classes (every class for []) on the targets
    the user sees, counted once per request: the dashboard's line and a generalist's
    navigation count are one query."""
    memo: dict[tuple[str, ...], int] = request.__dict__.setdefault("_infraops_awaiting", {})
    key = tuple(sorted(classes))
    if key not in memo:
        memo[key] = scoped(awaiting_for_classes(list(key)), request.user).count()
    return memo[key]
