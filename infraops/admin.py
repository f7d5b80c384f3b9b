"""The admin editor: targets, and goals with their boundary and criteria inline.

Validation speaks plain words: an unreachable repository, an unknown probe or metric, an
invalid glob. Saving a goal records a new GoalVersion; runs keep the version they pinned.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.forms.models import BaseInlineFormSet
from django.http import HttpRequest

from infraops.errors import DomainError
from infraops.models import (
    AcceptanceCriterion,
    AuditEntry,
    Boundary,
    Experiment,
    Goal,
    GoalVersion,
    Target,
)
from infraops.services.goals import goal_snapshot, metric_problem
from infraops.services.targets import repo_check, target_clone, target_refresh_manifest


class TargetForm(forms.ModelForm):  # type: ignore[type-arg]
    class Meta:
        model = Target
        fields = ["name", "repo_url", "base_branch", "push_on_merge"]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        url, branch = data.get("repo_url"), data.get("base_branch")
        changed = {"repo_url", "base_branch"} & set(self.changed_data)
        if url and branch and changed:
            try:
                repo_check(url=url, branch=branch)
            except DomainError as exc:
                raise forms.ValidationError(str(exc)) from None
        return data


@admin.register(Target)
class TargetAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    form = TargetForm
    list_display = ["name", "repo_url", "base_branch", "manifest_state", "refreshed_at"]
    readonly_fields = ["manifest_commit", "manifest_sha256", "manifest_problems", "refreshed_at"]
    actions = ["refresh_manifest"]

    @admin.display(description="manifest")
    def manifest_state(self, target: Target) -> str:
        if target.manifest_errors:
            return f"{len(target.manifest_errors)} problem(s)"
        return "valid" if target.manifest_text else "not read"

    @admin.display(description="manifest problems")
    def manifest_problems(self, target: Target) -> str:
        return "\n".join(target.manifest_errors) or "none"

    def save_model(self, request: HttpRequest, obj: Target, form: Any, change: bool) -> None:
        if not change:
            obj.created_by = request.user  # type: ignore[assignment]
        super().save_model(request, obj, form, change)
        try:
            if not change or {"repo_url"} & set(form.changed_data):
                target_clone(target=obj)
        except DomainError as exc:
            self.message_user(request, str(exc), messages.ERROR)
            return
        self._refresh(request, obj)

    @admin.action(description="Re-read infraops.toml from the base branch")
    def refresh_manifest(self, request: HttpRequest, queryset: QuerySet[Target]) -> None:
        for target in queryset:
            self._refresh(request, target)

    def _refresh(self, request: HttpRequest, target: Target) -> None:
        try:
            target_refresh_manifest(target=target)
        except DomainError as exc:
            self.message_user(request, str(exc), messages.ERROR)
            return
        if target.manifest_errors:
            self.message_user(request, f"{target.name}: infraops.toml has problems: "
                              + "; ".join(target.manifest_errors), messages.WARNING)


class BoundaryInline(admin.StackedInline):  # type: ignore[type-arg]
    model = Boundary
    can_delete = False
    min_num = 1
    max_num = 1


class CriterionFormSet(BaseInlineFormSet):  # type: ignore[type-arg]
    def clean(self) -> None:
        super().clean()
        goal: Goal = self.instance
        if not goal.target_id:
            return
        manifest = goal.target.manifest()
        for form in self.forms:
            data = getattr(form, "cleaned_data", None)
            if not data or data.get("DELETE") or not data.get("probe"):
                continue
            problem = metric_problem(manifest, data["probe"], data.get("metric", ""))
            if problem:
                form.add_error("metric" if "no metric" in problem else "probe", problem)


class CriterionInline(admin.TabularInline):  # type: ignore[type-arg]
    model = AcceptanceCriterion
    formset = CriterionFormSet
    extra = 0


class GoalForm(forms.ModelForm):  # type: ignore[type-arg]
    class Meta:
        model = Goal
        fields = ["target", "name", "probe", "metric", "direction", "relative_target",
                  "absolute_target", "policy", "model_name", "owner"]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        target: Target | None = data.get("target")
        if target is not None and data.get("probe"):
            problem = metric_problem(target.manifest(), data["probe"], data.get("metric", ""))
            if problem:
                self.add_error("metric" if "no metric" in problem else "probe", problem)
        if data.get("relative_target") is not None and data["relative_target"] <= 0:
            self.add_error("relative_target", "A wanted improvement is a positive fraction.")
        return data


@admin.register(Goal)
class GoalAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    form = GoalForm
    inlines = [BoundaryInline, CriterionInline]
    list_display = ["name", "target", "probe", "metric", "direction", "current_version"]
    list_select_related = ["target"]
    readonly_fields = ["current_version"]

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        super().save_related(request, form, formsets, change)
        version = goal_snapshot(goal=form.instance, user=request.user)  # type: ignore[arg-type]
        self.message_user(request, f"Goal saved as version {version.number}; running runs keep "
                                   "the version they started with.")


@admin.register(GoalVersion)
class GoalVersionAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["goal", "number", "created_by", "created_at"]
    readonly_fields = ["goal", "number", "spec", "created_by", "created_at"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Experiment)
class ExperimentAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["pk", "target", "status", "attempts", "origin", "created_at"]
    list_filter = ["status"]
    list_select_related = ["target"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(AuditEntry)
class AuditEntryAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["created_at", "actor_label", "action", "object_type", "object_id"]
    list_filter = ["action"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
