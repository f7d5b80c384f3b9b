"""Values every page needs: the user's roles and the review-queue count of the navigation.

Both are computed only where a template uses them: an htmx fragment that draws neither the
navigation nor role-dependent controls pays no query for them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.http import HttpRequest
from django.utils.functional import SimpleLazyObject

from infraops.access import request_roles
from reviews.live import awaiting_count, reviewer_classes


def infraops(request: HttpRequest) -> dict[str, Any]:
    return {"user_roles": SimpleLazyObject(lambda: request_roles(request)),
            "review_queue_count": _queue_count(request)}


def _queue_count(request: HttpRequest) -> Callable[[], int]:
    # A callable: the template engine calls it where the navigation is drawn, not before.
    def count() -> int:
        if not request.user.is_authenticated:
            return 0
        return awaiting_count(request, reviewer_classes(request.user))

    return count
