"""The skeleton library in the admin editor."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse

from infraops.access import NOT_FOUND, visible_target_ids
from infraops.services.admin_audit import audit_form_save
from skeletons.applicability import describe_conditions
from skeletons.models import Skeleton


class SkeletonForm(forms.ModelForm):  # type: ignore[type-arg]
    """The conditions are edited as JSON; what is wrong with them is said per condition, in
    words (Skeleton.clean), and text that is not JSON at all says how to write it."""

    applicability = forms.JSONField(
        label="Conditions", required=False, widget=forms.Textarea(attrs={"rows": 8}),
        help_text=Skeleton._meta.get_field("applicability").help_text,
        error_messages={"invalid": 'This is not JSON: write a list of conditions in double '
                                   'quotes, e.g. [{"field": "dtype", "op": "eq", "value": '
                                   '"tf32"}], or [] for none.'})
    provenance_url = forms.URLField(label="Provenance link", required=False,
                                    assume_scheme="https")

    class Meta:
        model = Skeleton
        fields = ["name", "slug", "summary", "applicability", "applicability_prose",
                  "transformation", "resource_constraints", "provenance", "provenance_url"]

    def clean_applicability(self) -> Any:
        found = self.cleaned_data.get("applicability")
        return [] if found is None else found


@admin.register(Skeleton)
class SkeletonAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """The library's entries. The status moves only by promotion on the skeleton's page
    (audited there); a draft proposed from a change is seen only by who sees its target; a
    skeleton with uses or evidence is a record and is not deleted."""

    form = SkeletonForm
    list_display = ["name", "status", "provenance", "updated_at"]
    list_filter = ["status"]
    search_fields = ["name", "summary", "transformation"]
    prepopulated_fields = {"slug": ["name"]}
    readonly_fields = ["status", "in_words", "proposed_from", "created_by", "promoted_by",
                       "promoted_at"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return super().get_queryset(request).filter(
            pk__in=Skeleton.objects.visible_to(visible_target_ids(request.user)).values("pk"))

    def _get_obj_does_not_exist_redirect(self, request: HttpRequest, opts: Any,
                                         object_id: str) -> HttpResponse:
        raise Http404(NOT_FOUND)

    @admin.display(description="Conditions in words")
    def in_words(self, obj: Skeleton) -> str:
        return "\n".join(describe_conditions(obj.applicability)) or "none"

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)  # it would not check each one's record
        return actions

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if not super().has_delete_permission(request, obj):
            return False
        return obj is None or not (obj.uses.exists() or obj.evidence.exists())

    def save_model(self, request: HttpRequest, obj: Skeleton, form: Any, change: bool) -> None:
        if not change:
            obj.created_by = request.user  # type: ignore[assignment]
        super().save_model(request, obj, form, change)
        audit_form_save(user=request.user, action=f"skeleton.{'change' if change else 'add'}",
                        form=form, created=not change)
