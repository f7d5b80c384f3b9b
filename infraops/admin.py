"""The admin editor: targets, and goals with their boundary and criteria inline.

Validation speaks plain words: an unreachable repository, an unknown probe or metric, an
invalid glob. Saving a goal records a new GoalVersion; runs keep the version they pinned.

Records stay records: versions, experiments, runs, changes, decisions and audit entries are
view only here (RecordAdmin, RecordInline), and a target or goal with any of them cannot be
deleted. Every save that changes a target, goal, boundary or criterion is audited field by
field (infraops.services.admin_audit).
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.auth.models import User
from django.db.models import Count, QuerySet
from django.forms.models import BaseInlineFormSet, BaseModelFormSet
from django.http import Http404, HttpRequest, HttpResponse

from infraops.access import NOT_FOUND, has_target_role, scoped, targets_with_role
from infraops.errors import DomainError
from infraops.models import (
    AcceptanceCriterion,
    AuditEntry,
    Boundary,
    Experiment,
    Goal,
    GoalVersion,
    Target,
    TargetMembership,
)
from infraops.roles import ENGINEER
from infraops.services.admin_audit import audit_form_save, formset_save_audited, record_values
from infraops.services.audit import audit_record
from infraops.services.goals import goal_snapshot, metric_problem, spec_changes
from infraops.services.targets import repo_check, target_clone, target_refresh_manifest

# The admin is the product's editor: its name, and a way back to the dashboard.
admin.site.site_header = "InfraOps · admin editor"
admin.site.site_title = "InfraOps admin editor"
admin.site.index_title = "Targets, goals, boundaries and criteria"
admin.site.site_url = "/"


class TargetScopedAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Lists and pages only the rows of the targets the user sees (infraops.access); any
    other id answers 404, as a missing one does. Editing needs the engineer role on the row's
    target. `target_path` leads from the row to its target ("" for a target itself)."""

    target_path = "target"

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return scoped(super().get_queryset(request), request.user, self.target_path)

    def _get_obj_does_not_exist_redirect(self, request: HttpRequest, opts: Any,
                                         object_id: str) -> HttpResponse:
        # Django redirects to the index with "doesn't exist"; ours is the site's 404.
        raise Http404(NOT_FOUND)

    def target_id_of(self, obj: Any) -> int:
        for name in filter(None, self.target_path.split("__")):
            obj = getattr(obj, name)
        return int(obj.pk)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if not super().has_change_permission(request, obj):
            return False
        return obj is None or has_target_role(request.user, self.target_id_of(obj), ENGINEER)


class RecordAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """View only: a record of what happened is never added, edited or deleted here. With no
    delete permission the changelist also loses its bulk "delete selected" action."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class RecordInline(admin.TabularInline):  # type: ignore[type-arg]
    """View only, like RecordAdmin, for records shown inside another record's page."""

    extra = 0
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


def _records_text(counts: dict[str, int]) -> str:
    kept = ", ".join(f"{label}: {n}" for label, n in counts.items() if n)
    if not kept:
        return "None yet."
    return f"{kept}. Records stay records, so it cannot be deleted."


def _target_records(target: Target) -> dict[str, int]:
    """What deleting the target would take with it that must stay on record."""
    return {
        "goal versions": GoalVersion.objects.filter(goal__target=target).count(),
        "experiments": target.experiments.count(),
        "runs": target.runs.count(),
        "changes": target.changes.count(),
    }


def _goal_records(goal: Goal) -> dict[str, int]:
    """What deleting the goal would take with it that must stay on record."""
    counted = goal.versions.aggregate(versions=Count("pk", distinct=True),
                                      runs=Count("runs", distinct=True))
    return {"versions": counted["versions"], "runs": counted["runs"],
            "changes": goal.changes.count()}


class TargetForm(forms.ModelForm):  # type: ignore[type-arg]
    class Meta:
        model = Target
        fields = ["name", "repo_url", "base_branch", "push_on_merge"]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        # repo_check hands both to `git ls-remote` without a "--": a leading "-" would be
        # read as an option (--upload-pack=... runs a command).
        for name in ("repo_url", "base_branch"):
            if (data.get(name) or "").startswith("-"):
                self.add_error(name, "This cannot begin with '-'.")
        url, branch = data.get("repo_url"), data.get("base_branch")
        changed = {"repo_url", "base_branch"} & set(self.changed_data)
        if url and branch and changed:
            try:
                repo_check(url=url, branch=branch)
            except DomainError as exc:
                raise forms.ValidationError(str(exc)) from None
        return data


class HistoryKeptAdmin(TargetScopedAdmin):
    """An editable head (target, goal) whose deletion would cascade records away: deletable
    one at a time, only while `records_of` finds none, and audited. The change page's
    "records" line says what it has, hence why there is no Delete button."""

    audit_noun = ""

    def records_of(self, obj: Any) -> dict[str, int]:
        raise NotImplementedError

    @admin.display(description="records")
    def records(self, obj: Any) -> str:
        return _records_text(self.records_of(obj)) if obj.pk is not None else ""

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        fields = list(super().get_readonly_fields(request, obj))
        return [*fields, "records"] if obj is not None else fields

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        # The bulk action checks no object's records; deletions go through the object page.
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)
        return actions

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if not super().has_delete_permission(request, obj):
            return False
        return obj is None or not any(self.records_of(obj).values())

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        fields = list(self.form._meta.fields or [])
        audit_record(actor=request.user, action=f"{self.audit_noun}.delete", obj=obj,
                     data={"deleted": record_values(obj, fields)})
        super().delete_model(request, obj)

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        action = f"{self.audit_noun}.{'change' if change else 'add'}"
        audit_form_save(user=request.user, action=action, form=form, created=not change)


class MembershipInline(admin.TabularInline):  # type: ignore[type-arg]
    """Who sees the target, and in which role: admins (superusers) only."""

    model = TargetMembership
    extra = 0
    fields = ["user", "role"]

    def _admin(self, request: HttpRequest) -> bool:
        return bool(getattr(request.user, "is_superuser", False))

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self._admin(request)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self._admin(request)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self._admin(request)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self._admin(request)


@admin.register(Target)
class TargetAdmin(HistoryKeptAdmin):
    form = TargetForm
    audit_noun = "target"
    target_path = ""
    inlines = [MembershipInline]
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

    def records_of(self, obj: Target) -> dict[str, int]:
        return _target_records(obj)

    def save_formset(self, request: HttpRequest, form: Any, formset: BaseModelFormSet[Any, Any],
                     change: bool) -> None:
        formset_save_audited(user=request.user, formset=formset, noun="membership",
                             data={"target": form.instance.pk})

    def save_model(self, request: HttpRequest, obj: Target, form: Any, change: bool) -> None:
        if not change:
            obj.created_by = request.user  # type: ignore[assignment]
        super().save_model(request, obj, form, change)
        user = request.user
        if not change and isinstance(user, User) and not user.is_superuser:
            # Its engineer sees what they made; an admin adds anyone else.
            TargetMembership.objects.create(target=obj, user=user, role=ENGINEER)
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


class CriterionForm(forms.ModelForm):  # type: ignore[type-arg]
    manifest_targets: list[Target] = []  # set per request by GoalAdmin

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        offer_manifest_values(self, self.manifest_targets)


class CriterionInline(admin.TabularInline):  # type: ignore[type-arg]
    model = AcceptanceCriterion
    form = CriterionForm
    formset = CriterionFormSet
    extra = 0


MAX_RAISE = 10.0  # the most a raised metric may be asked to grow: 1000%


def manifest_choices(targets: list[Target]) -> tuple[list[Any], list[Any]]:
    """The probes and metrics of the targets' manifests, as choices grouped by target (and
    probe): a goal or criterion names what the manifest declares, not free text."""
    probes: list[Any] = []
    metrics: list[Any] = []
    for target in targets:
        manifest = target.manifest()
        if manifest is None:
            continue
        probes.append((target.name, [(p.name, p.name) for p in manifest.probes]))
        metrics += [(f"{target.name} / {p.name}", [(m, m) for m in p.metrics])
                    for p in manifest.probes]
    return probes, metrics


def offer_manifest_values(form: forms.BaseForm, targets: list[Target]) -> None:
    """Probe and metric as selects of the manifests' values; a stored value the manifest no
    longer declares is kept as a choice, so the form shows it and clean() names the problem."""
    probes, metrics = manifest_choices(targets)
    for name, groups in (("probe", probes), ("metric", metrics)):
        if name not in form.fields:
            continue
        field = form.fields[name]
        current = form.initial.get(name) or ""
        offered = {value for _, options in groups for value, _ in options}
        extra = [(current, f"{current} (not in the manifest)")] if current and \
            current not in offered else []
        # A select of text: a value the manifest lacks (a crafted post) reaches clean(),
        # which names what the manifest lacks, rather than a bare "not a valid choice".
        field.widget = forms.Select(choices=[("", "---------"), *extra, *groups])


class GoalForm(forms.ModelForm):  # type: ignore[type-arg]
    manifest_targets: list[Target] = []  # set per request by GoalAdmin.get_form

    class Meta:
        model = Goal
        fields = ["target", "name", "probe", "metric", "direction", "relative_target",
                  "absolute_target", "min_effect", "policy", "model_name", "owner", "auto_merge"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        offer_manifest_values(self, self.manifest_targets)

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        target: Target | None = data.get("target")
        if target is not None and data.get("probe"):
            problem = metric_problem(target.manifest(), data["probe"], data.get("metric", ""))
            if problem:
                self.add_error("metric" if "no metric" in problem else "probe", problem)
        wanted = data.get("relative_target")
        if wanted is not None and wanted <= 0:
            self.add_error("relative_target", "A wanted improvement is a positive fraction.")
        elif wanted is not None and data.get("direction") == Goal.Direction.MINIMIZE and \
                wanted >= 1:
            self.add_error("relative_target", f"{wanted:.0%} lower is impossible: a lowered "
                           "metric can fall by less than 100% (0.10 asks for 10% lower).")
        elif wanted is not None and wanted > MAX_RAISE:
            self.add_error("relative_target", f"{wanted:.0%} higher is not a goal a run can "
                           f"reach; at most {MAX_RAISE:.0%} (0.10 asks for 10% higher).")
        return data


@admin.register(Goal)
class GoalAdmin(HistoryKeptAdmin):
    form = GoalForm
    audit_noun = "goal"
    inlines = [BoundaryInline, CriterionInline]
    list_display = ["name", "target", "probe", "metric", "direction", "auto_merge",
                    "current_version"]
    list_select_related = ["target"]
    readonly_fields = ["current_version"]
    inline_nouns = {Boundary: "boundary", AcceptanceCriterion: "criterion"}

    @admin.display(description="In one sentence")
    def meaning(self, obj: Goal) -> str:
        return obj.meaning() if obj.pk else "Saved goals say here what they ask for."

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return ["meaning", *super().get_readonly_fields(request, obj)]

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False,
                 **kwargs: Any) -> Any:
        form = super().get_form(request, obj, change=change, **kwargs)
        setattr(form, "manifest_targets",  # noqa: B010 (a class made per request)
                [obj.target] if obj is not None else
                list(targets_with_role(request.user, ENGINEER)))
        return form

    def get_formsets_with_inlines(self, request: HttpRequest, obj: Any = None) -> Any:
        for formset, inline in super().get_formsets_with_inlines(request, obj):
            if inline.model is AcceptanceCriterion:
                setattr(formset.form, "manifest_targets",  # noqa: B010 (a class made per request)
                        [obj.target] if obj is not None else
                        list(targets_with_role(request.user, ENGINEER)))
            yield formset, inline

    def records_of(self, obj: Goal) -> dict[str, int]:
        return _goal_records(obj)

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        if db_field.name == "target":  # a goal goes only on a target its engineer edits
            kwargs["queryset"] = targets_with_role(request.user, ENGINEER)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def save_formset(self, request: HttpRequest, form: Any, formset: BaseModelFormSet[Any, Any],
                     change: bool) -> None:
        formset_save_audited(user=request.user, formset=formset,
                             noun=self.inline_nouns[formset.model],
                             data={"goal": form.instance.pk})

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        super().save_related(request, form, formsets, change)
        version = goal_snapshot(goal=form.instance, user=request.user)  # type: ignore[arg-type]
        self.message_user(request, f"Goal saved as version {version.number}; running runs keep "
                                   "the version they started with.")


@admin.register(GoalVersion)
class GoalVersionAdmin(TargetScopedAdmin, RecordAdmin):
    target_path = "goal__target"
    list_display = ["goal", "number", "created_by", "created_at"]
    list_select_related = ["goal__target", "created_by"]
    fields = ["goal", "number", "changed", "spec", "created_by", "created_at"]
    readonly_fields = ["created_at", "changed"]  # not editable: a form cannot list them

    @admin.display(description="What it changed")
    def changed(self, obj: GoalVersion) -> str:
        """Against the version before, one setting a line (not the raw JSON below)."""
        if obj.pk is None:
            return ""
        before = (GoalVersion.objects.filter(goal_id=obj.goal_id, number__lt=obj.number)
                  .order_by("-number").values_list("spec", flat=True).first())
        return "\n".join(spec_changes(before, obj.spec))


@admin.register(Experiment)
class ExperimentAdmin(TargetScopedAdmin, RecordAdmin):
    list_display = ["pk", "target", "status", "attempts", "origin", "created_at"]
    list_filter = ["status"]
    list_select_related = ["target"]


@admin.register(AuditEntry)
class AuditEntryAdmin(RecordAdmin):
    list_display = ["created_at", "actor_label", "action", "object_type", "object_id"]
    list_filter = ["action"]
