"""Values every page needs: the user's roles."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from infraops.roles import user_roles


def infraops(request: HttpRequest) -> dict[str, Any]:
    return {"user_roles": user_roles(request.user)}
