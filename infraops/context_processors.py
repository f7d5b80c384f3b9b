"""Values every page needs: the user's roles and the review-queue count of the navigation.

Both are computed only where a template uses them: an htmx fragment that draws neither the
navigation nor role-dependent controls pays no query for them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.http import HttpRequest
from django.utils.functional import SimpleLazyObject

from infraops.roles import user_roles
from reviews.live import awaiting_for


def infraops(request: HttpRequest) -> dict[str, Any]:
    return {"user_roles": SimpleLazyObject(lambda: user_roles(request.user)),
            "review_queue_count": _queue_count(request)}


def _queue_count(request: HttpRequest) -> Callable[[], int]:
    # A callable: the template engine calls it where the navigation is drawn, not before.
    def count() -> int:
        return awaiting_for(request.user).count() if request.user.is_authenticated else 0

    return count
