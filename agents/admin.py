from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from agents.models import AgentRun


@admin.register(AgentRun)
class AgentRunAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Read-only here: runs are started and steered from their pages."""

    list_display = ["pk", "target", "goal_version", "status", "step_count", "created_at"]
    list_filter = ["status"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
