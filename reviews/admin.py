"""Changes with their decisions and comments, view only; reviewers' risk classes, audited."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.contrib.auth.models import User
from django.db import models
from django.db.models import Q, QuerySet
from django.http import HttpRequest

from infraops.admin import RecordAdmin, RecordInline, TargetScopedAdmin
from infraops.roles import REVIEWER
from infraops.services.admin_audit import audit_form_save
from reviews.models import RISK_CLASSES, Change, ReviewComment, ReviewDecision, ReviewerProfile


class DecisionInline(RecordInline):
    model = ReviewDecision
    fields = ["reviewer", "decision", "comment", "diff_sha256", "base_commit", "created_at"]
    readonly_fields = ["created_at"]  # not editable: a form cannot list it


class CommentInline(RecordInline):
    model = ReviewComment
    fields = ["author", "path", "line", "side", "text", "diff_sha256", "created_at"]
    readonly_fields = ["created_at"]  # not editable: a form cannot list it


@admin.register(Change)
class ChangeAdmin(TargetScopedAdmin, RecordAdmin):
    """View only: decisions are made on the review page, where the rules are enforced."""

    list_display = ["pk", "title", "target", "status", "created_at"]
    list_filter = ["status"]
    list_select_related = ["target"]
    inlines = [DecisionInline, CommentInline]


def reviewers() -> QuerySet[User]:
    """Users who hold the reviewer role (superusers hold every role, as in infraops.roles)."""
    return (User.objects.filter(Q(groups__name=REVIEWER) | Q(is_superuser=True))
            .distinct().order_by("username"))


class ReviewerProfileForm(forms.ModelForm):  # type: ignore[type-arg]
    risk_classes = forms.MultipleChoiceField(
        choices=[(c, c) for c in RISK_CLASSES], required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="None ticked: a generalist who may decide on every class.",
    )

    class Meta:
        model = ReviewerProfile
        fields = ["user", "risk_classes"]

    def clean_risk_classes(self) -> list[str]:
        chosen = set(self.cleaned_data.get("risk_classes") or [])
        return [c for c in RISK_CLASSES if c in chosen]


@admin.register(ReviewerProfile)
class ReviewerProfileAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Which risk classes a reviewer covers. Every save is audited as "reviewer.classes";
    a profile is not deleted: no class ticked makes the reviewer a generalist again."""

    form = ReviewerProfileForm
    list_display = ["user", "classes"]
    list_select_related = ["user"]

    @admin.display(description="risk classes")
    def classes(self, profile: ReviewerProfile) -> str:
        return ", ".join(profile.risk_classes) or "every class"

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return ["user"] if obj is not None else []

    def formfield_for_foreignkey(self, db_field: models.ForeignKey[Any, Any],
                                 request: HttpRequest, **kwargs: Any) -> Any:
        if db_field.name == "user":
            kwargs["queryset"] = reviewers()
            kwargs["error_messages"] = {
                "invalid_choice": "Choose a user with the reviewer role: give them the "
                                  "role first."}
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: ReviewerProfile, form: Any,
                   change: bool) -> None:
        super().save_model(request, obj, form, change)
        audit_form_save(user=request.user, action="reviewer.classes", form=form,
                        created=not change, data={"user": obj.user.get_username()})
