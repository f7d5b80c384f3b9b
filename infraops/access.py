"""Access checks shared by the views: a role, or a 403 with the reason."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest
from django_htmx.middleware import HtmxDetails

from infraops.roles import has_role, user_roles


class HtmxHttpRequest(HttpRequest):
    """The request type of our views: HtmxMiddleware adds .htmx."""

    htmx: HtmxDetails


def require_any_role(request: HttpRequest) -> None:
    if not user_roles(request.user):
        raise PermissionDenied("Your account has no role yet: ask an admin for one.")


def require_role(request: HttpRequest, role: str) -> None:
    if not has_role(request.user, role):
        raise PermissionDenied(f"This needs the {role} role.")
