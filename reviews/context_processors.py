"""The review queue's count in the navigation of every page."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.http import HttpRequest

from reviews.live import awaiting_count, reviewer_classes


def review_queue(request: HttpRequest) -> dict[str, Any]:
    return {"review_queue_count": _queue_count(request)}


def _queue_count(request: HttpRequest) -> Callable[[], int]:
    # A callable: the template engine calls it where the navigation is drawn, not before.
    def count() -> int:
        if not request.user.is_authenticated:
            return 0
        return awaiting_count(request, reviewer_classes(request.user))

    return count
