from __future__ import annotations

from django.contrib import admin

from agents.models import AgentRun
from infraops.admin import RecordAdmin, TargetScopedAdmin


@admin.register(AgentRun)
class AgentRunAdmin(TargetScopedAdmin, RecordAdmin):
    """View only: runs are started and steered from their pages."""

    list_display = ["pk", "target", "goal_version", "status", "step_count", "created_at"]
    list_filter = ["status"]
    list_select_related = ["target", "goal_version__goal__target"]
