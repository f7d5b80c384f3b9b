from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from reviews.models import Change, ReviewDecision


class DecisionInline(admin.TabularInline):  # type: ignore[type-arg]
    model = ReviewDecision
    extra = 0
    can_delete = False
    readonly_fields = ["reviewer", "decision", "comment", "diff_sha256", "base_commit",
                       "created_at"]

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Change)
class ChangeAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Read-only here: decisions are made on the review page, where the rules are enforced."""

    list_display = ["pk", "title", "target", "status", "created_at"]
    list_filter = ["status"]
    inlines = [DecisionInline]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
