"""Per-user limits on approvals and run starts, shared by every web process through Redis.

A fixed window per user and action: the user's first call starts a window of
RATE_WINDOW_SECONDS, the first RATE_<ACTION>_PER_MIN calls in it go through, the rest answer
429 with a sentence saying when to try again, and nothing is created. The counts live in the
"limits" cache (Redis), so every web process counts the same calls; if that cache fails,
nothing is refused (the failure is logged), as the sign-in throttle (infraops/project/login.py)
does.
"""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.core.cache import caches
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

log = logging.getLogger(__name__)

APPROVE = "approve"
START_RUN = "start_run"
# An experiment asked for from a target page is a start too: it queues work for the workers.
WORDS = {APPROVE: "approvals", START_RUN: "run starts"}


def window_count(cache: Any, key: str, window: int) -> int:
    """Add one to the count at `key` and return it; the window starts at the first one."""
    cache.add(key, 0, timeout=window)  # does nothing while the window runs
    try:
        return int(cache.incr(key))
    except ValueError:  # expired between add and incr
        cache.set(key, 1, timeout=window)
        return 1


def _limit(action: str) -> int:
    return int({APPROVE: settings.RATE_APPROVE_PER_MIN,
                START_RUN: settings.RATE_START_RUN_PER_MIN}[action])


def _key(user_id: int, action: str) -> str:
    return f"rate:{action}:{user_id}"


def rate_exceeded(*, user_id: int, action: str) -> bool:
    """Count one call of the user's; True when it is over the action's limit."""
    try:
        count = window_count(caches["limits"], _key(user_id, action),
                             settings.RATE_WINDOW_SECONDS)
    except Exception:
        log.exception("the rate limit could not count a call")
        return False
    return count > _limit(action)


def rate_reset(*, user_id: int, action: str) -> None:
    """Forget a user's count for an action (tests, an admin's shell)."""
    caches["limits"].delete(_key(user_id, action))


def throttled(request: HttpRequest, action: str) -> HttpResponse | None:
    """None while the user is under the limit; else the 429 page (the message alone for
    htmx, which swaps it where the answer goes)."""
    if not rate_exceeded(user_id=int(request.user.pk or 0), action=action):
        return None
    seconds = settings.RATE_WINDOW_SECONDS
    message = (f"Too many {WORDS[action]}: at most {_limit(action)} in {seconds} seconds. "
               f"Nothing was done; try again in a minute or so.")
    template = "rate_limited.html#rate-limited" if getattr(request, "htmx", False) \
        else "rate_limited.html"
    response = render(request, template, {"message": message}, status=429)
    response["Retry-After"] = str(seconds)
    return response
