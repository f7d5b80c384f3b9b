"""Values every page needs: the user's roles (the review queue's count of the navigation is
reviews.context_processors').

Computed only where a template uses them: an htmx fragment that draws no role-dependent
control pays no query for them.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from django.utils.functional import SimpleLazyObject

from infraops.access import request_roles


def infraops(request: HttpRequest) -> dict[str, Any]:
    return {"user_roles": SimpleLazyObject(lambda: request_roles(request))}
