"""Values every page needs: the user's roles and whether probes run unconfined."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpRequest

from infraops.roles import user_roles


def infraops(request: HttpRequest) -> dict[str, Any]:
    return {
        "user_roles": user_roles(request.user),
        "sandbox_trusted_mode": settings.SANDBOX_TRUSTED_MODE,
    }
