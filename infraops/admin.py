"""The admin editor: targets, and goals with their boundary and criteria inline.

Validation speaks plain words: an unreachable repository, an unknown probe or metric, a
variant cell the probe lacks, an invalid glob, an absurd target, bound or budget. Saving a
goal records a new GoalVersion; runs keep the version they pinned.

Records stay records: versions, experiments, runs, changes, decisions and audit entries are
view only here (RecordAdmin, RecordInline), and a target or goal with any of them cannot be
deleted. Every save that changes a target, goal, boundary or criterion is audited field by
field (infraops.services.admin_audit).
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.auth.admin import UserAdmin
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.core.validators import MinValueValidator
from django.db.models import Count, QuerySet
from django.forms.models import BaseInlineFormSet, BaseModelFormSet
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.utils import timezone

from infraops.access import (
    NOT_FOUND,
    has_target_role,
    scoped,
    targets_with_role,
)
from infraops.errors import DomainError
from infraops.experiments.fleet import queues_parse, worker_register, worker_revoke, worker_state
from infraops.grants import (
    grant_policy_set,
    membership_grant,
    membership_stamp,
    roles_changed_audit,
)
from infraops.manifest import Manifest, Probe
from infraops.models import (
    AcceptanceCriterion,
    AuditEntry,
    Boundary,
    Experiment,
    Goal,
    GoalVersion,
    GrantPolicy,
    SuperuserGrant,
    Target,
    TargetMembership,
    Worker,
    parse_variant,
    variant_key,
)
from infraops.roles import ENGINEER
from infraops.services.admin_audit import audit_form_save, formset_save_audited, record_values
from infraops.services.audit import audit_record
from infraops.services.goals import goal_snapshot, metric_problem, spec_changes
from infraops.services.targets import repo_url_allowed, target_fetch_request

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
        # The worker's repo_check hands both to `git ls-remote`: a leading "-" would be read
        # as an option (--upload-pack=... runs a command).
        for name in ("repo_url", "base_branch"):
            if (data.get(name) or "").startswith("-"):
                self.add_error(name, "This cannot begin with '-'.")
        url = data.get("repo_url")
        if url and "repo_url" in self.changed_data:
            try:
                repo_url_allowed(url=url)  # the policy only: git runs in a worker
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
    """Who sees the target, and in which role: admins (superusers) only. Who granted each
    role and when is recorded on save (infraops.grants), and shown, not edited."""

    model = TargetMembership
    extra = 0
    fields = ["user", "role", "granted_by_label", "granted_at"]
    readonly_fields = ["granted_by_label", "granted_at"]

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
    list_display = ["name", "repo_url", "base_branch", "fetch_state", "manifest_state",
                    "refreshed_at"]
    readonly_fields = ["fetch_state", "manifest_commit", "manifest_sha256", "manifest_problems",
                       "refreshed_at"]
    actions = ["refresh_manifest"]

    @admin.display(description="manifest")
    def manifest_state(self, target: Target) -> str:
        if target.manifest_errors:
            return f"{len(target.manifest_errors)} problem(s)"
        return "valid" if target.manifest_text else "not read"

    @admin.display(description="repository")
    def fetch_state(self, target: Target) -> str:
        if target.fetch_status == Target.Fetch.FAILED:
            return f"fetch failed: {target.fetch_error}"
        return target.get_fetch_status_display()

    @admin.display(description="manifest problems")
    def manifest_problems(self, target: Target) -> str:
        return "\n".join(target.manifest_errors) or "none"

    def records_of(self, obj: Target) -> dict[str, int]:
        return _target_records(obj)

    def save_formset(self, request: HttpRequest, form: Any, formset: BaseModelFormSet[Any, Any],
                     change: bool) -> None:
        for member_form in formset.forms:
            granted = {"user", "role"} & set(member_form.changed_data)
            if granted and member_form not in formset.deleted_forms:
                membership_stamp(member_form.instance, by=request.user)  # type: ignore[arg-type]
        formset_save_audited(user=request.user, formset=formset, noun="membership",
                             data={"target": form.instance.pk})

    def save_model(self, request: HttpRequest, obj: Target, form: Any, change: bool) -> None:
        if not change:
            obj.created_by = request.user  # type: ignore[assignment]
        super().save_model(request, obj, form, change)
        user = request.user
        if not change and isinstance(user, User) and not user.is_superuser:
            # Its engineer sees what they made; an admin adds anyone else.
            membership_grant(target=obj, user=user, role=ENGINEER, by=user)
        changed = set(form.changed_data)
        new_url = not change or "repo_url" in changed
        if new_url or "base_branch" in changed:
            self._fetch(request, obj, check=True, reclone=new_url)

    @admin.action(description="Re-read infraops.toml from the base branch")
    def refresh_manifest(self, request: HttpRequest, queryset: QuerySet[Target]) -> None:
        for target in queryset:
            self._fetch(request, target, check=False, reclone=False)

    def _fetch(self, request: HttpRequest, target: Target, *, check: bool,
               reclone: bool) -> None:
        """Hand the git work to a worker (issue 28: never in the request); its page says
        when the repository is ready, or why the fetch failed."""
        target_fetch_request(target=target, check=check, reclone=reclone)
        self.message_user(request, f"{target.name}: {target.repo_url} is being fetched by a "
                          "worker; the target's page says when it is ready, or why it failed.",
                          messages.INFO)


class BoundaryForm(forms.ModelForm):  # type: ignore[type-arg]
    """A budget's floor is the model's, in its words ("An experiment budget is at least 1
    experiment."). The form field's own floor of a PositiveIntegerField, 0, would answer -3
    with "greater than or equal to 0": unclear, and wrong, as 0 is refused too. The model
    field keeps a floor whatever it declares, so none is lost."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for field in self.fields.values():
            if getattr(field, "min_value", None) is not None:
                field.validators = [v for v in field.validators
                                    if not isinstance(v, MinValueValidator)]


class BoundaryInline(admin.StackedInline):  # type: ignore[type-arg]
    model = Boundary
    form = BoundaryForm
    can_delete = False
    min_num = 1
    max_num = 1

    class Media:
        css = {"all": ["css/admin.css"]}  # budgets as wide as their largest values


MAX_RAISE = 10.0  # the most a raised metric may be asked to grow: 1000%
MAX_CELLS_NAMED = 12  # an error lists at most this many of a probe's variant cells


def variant_cells(probe: Probe) -> list[str]:
    """The probe's variant cells as variant_key spells them (the text samples are stored
    under), without the default cell '' of a probe with no variants: the blank choice is it."""
    return [cell for cell in map(variant_key, probe.variant_matrix()) if cell]


def canonical_variant(text: str) -> str:
    """'b=2, a=1' -> 'a=1,b=2', so a cell written by hand before the editor offered choices
    still selects its choice. Text that is no variant, or names a key twice (parsing would
    keep one value silently), is returned as written, for clean() to name what is wrong."""
    try:
        parsed = parse_variant(text)
    except ValueError:
        return text
    written = [part for part in text.split(",") if part.strip()]
    return variant_key(parsed) if len(parsed) == len(written) else text


def variant_problem(manifest: Manifest | None, probe: str, variant: str) -> str | None:
    """Why `variant` is no cell of the probe's variant matrix, in words; None when it is, or
    when it is blank (every cell). A criterion on any other text would never be measured.
    An unknown probe is metric_problem's to name."""
    found = manifest.probe(probe) if manifest is not None else None
    if not variant or found is None:
        return None
    cells = variant_cells(found)
    if variant in cells:
        return None
    if not cells:
        return f"Probe {probe!r} declares no variants: leave this blank (its one cell)."
    named = ", ".join(cells[:MAX_CELLS_NAMED]) + (", ..." if len(cells) > MAX_CELLS_NAMED else "")
    return f"Probe {probe!r} has no variant cell {variant!r} (its cells: {named})."


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
            # add_error takes a field out of cleaned_data: read them all first.
            probe, metric = data["probe"], data.get("metric", "")
            cells = {name: data.get(name, "") for name in ("variant", "reference_variant")}
            problem = metric_problem(manifest, probe, metric)
            if problem:
                form.add_error("metric" if "no metric" in problem else "probe", problem)
            for name, cell in cells.items():
                problem = variant_problem(manifest, probe, cell)
                if problem:
                    form.add_error(name, problem)


def bound_problem(kind: str, value: float) -> str | None:
    """Why a relative or relation criterion's bound is absurd, in words; None if it is not.
    Its quantity is a ratio minus one of positive metrics, so it lies above -100%: a bound at
    or below that is always met or never; and a relative one beyond MAX_RAISE, as a goal's."""
    if kind == AcceptanceCriterion.Kind.THRESHOLD:
        return None
    if value <= -1:
        return (f"{value:+.0%} is no bound: a metric falls by less than 100%, so it is always "
                "met or never (-0.05 means 5% lower).")
    if kind == AcceptanceCriterion.Kind.RELATIVE and value > MAX_RAISE:
        return (f"{value:+.0%} against the baseline is not a change a run can show; at most "
                f"{MAX_RAISE:+.0%} (0.05 means 5% higher).")
    return None


class CriterionForm(forms.ModelForm):  # type: ignore[type-arg]
    manifest_targets: list[Target] = []  # set per request by GoalAdmin

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        offer_manifest_values(self, self.manifest_targets)

    def clean_variant(self) -> str:
        return canonical_variant(self.cleaned_data["variant"])

    def clean_reference_variant(self) -> str:
        return canonical_variant(self.cleaned_data["reference_variant"])

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        kind, value = data.get("kind"), data.get("value")
        problem = bound_problem(kind, value) if kind and value is not None else None
        if problem:
            self.add_error("value", problem)
        if kind == AcceptanceCriterion.Kind.RELATION and data.get("variant") and \
                data.get("variant") == data.get("reference_variant"):
            self.add_error("reference_variant", "A relation compares two different cells: "
                           "this is its variant itself, so the gap is always 0.")
        return data


class CriterionInline(admin.TabularInline):  # type: ignore[type-arg]
    """As a table its eight columns are wider than the page below a 1,900 px screen, so each
    criterion is a block of labelled fields that wrap to the page's width, one under the other
    on a phone (the template labels each cell, static/css/admin.css lays them out)."""

    model = AcceptanceCriterion
    form = CriterionForm
    formset = CriterionFormSet
    extra = 0
    template = "admin/edit_inline/tabular_labelled.html"

    class Media:
        css = {"all": ["css/admin.css"]}


def manifest_choices(targets: list[Target]) -> dict[str, list[Any]]:
    """The probes, metrics and variant cells of the targets' manifests, as choices grouped by
    target (and probe): a goal or criterion names what the manifest declares, not free text.
    Probes without variants add no cells: the blank choice is their one cell."""
    choices: dict[str, list[Any]] = {"probe": [], "metric": [], "variant": []}
    for target in targets:
        manifest = target.manifest()
        if manifest is None:
            continue
        choices["probe"].append((target.name, [(p.name, p.name) for p in manifest.probes]))
        for p in manifest.probes:
            group = f"{target.name} / {p.name}"
            choices["metric"].append((group, [(m, m) for m in p.metrics]))
            cells = variant_cells(p)
            if cells:
                choices["variant"].append((group, [(c, c) for c in cells]))
    choices["reference_variant"] = choices["variant"]
    return choices


# What the blank choice of each field means, and what a variant select is.
BLANK_CHOICES = {"probe": "---------", "metric": "---------", "variant": "every cell",
                 "reference_variant": "none"}
VARIANT_HELP = {
    "variant": "A cell of the criterion's probe's variant matrix (its variants in "
               "infraops.toml), grouped by target / probe; blank: every cell.",
    "reference_variant": "For a relation: the cell of the same probe compared against.",
}


def offer_manifest_values(form: forms.BaseForm, targets: list[Target]) -> None:
    """Probe, metric and variants as selects of the manifests' values; a stored value the
    manifest no longer declares is kept as a choice, so the form shows it (rather than the
    browser silently picking the first choice) and clean() names the problem."""
    for name, groups in manifest_choices(targets).items():
        if name not in form.fields:
            continue
        field = form.fields[name]
        current = form.initial.get(name) or ""
        if name in VARIANT_HELP:
            current = form.initial[name] = canonical_variant(current)
            field.help_text = VARIANT_HELP[name]
        offered = {value for _, options in groups for value, _ in options}
        extra = [(current, f"{current} (not in the manifest)")] if current and \
            current not in offered else []
        # A select of text: a value the manifest lacks (a crafted post) reaches clean(),
        # which names what the manifest lacks, rather than a bare "not a valid choice".
        field.widget = forms.Select(choices=[("", BLANK_CHOICES[name]), *extra, *groups])


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


@admin.register(SuperuserGrant)
class SuperuserGrantAdmin(RecordAdmin):
    """Who made whom a superuser, and when (infraops.grants): a record, view only."""

    list_display = ["user", "granted_by_label", "granted_at"]
    list_select_related = ["user"]


class GrantPolicyForm(forms.ModelForm):  # type: ignore[type-arg]
    class Meta:
        model = GrantPolicy
        fields = ["cooldown_hours"]


@admin.register(GrantPolicy)
class GrantPolicyAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Separation of duties' cool-down: one row, admins (superusers) only. The list opens the
    row; a save goes through grant_policy_set (audited; a lowering waits, GrantPolicy)."""

    form = GrantPolicyForm
    readonly_fields = ["in_force", "changed"]

    def _admin(self, request: HttpRequest) -> bool:
        return bool(getattr(request.user, "is_superuser", False))

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self._admin(request)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self._admin(request)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self._admin(request)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_object(self, request: HttpRequest, object_id: str,
                   from_field: str | None = None) -> GrantPolicy | None:
        return GrantPolicy.load() if object_id == str(GrantPolicy.SINGLETON) else None

    def changelist_view(self, request: HttpRequest,
                        extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        return redirect("admin:infraops_grantpolicy_change", GrantPolicy.SINGLETON)

    @admin.display(description="in force now")
    def in_force(self, policy: GrantPolicy) -> str:
        now = timezone.now()
        text = f"{policy.cooldown_at(now):g} hours"
        if policy.cooldown_hours is None:
            text += " (the default, INFRAOPS_REVIEW_GRANT_COOLDOWN_HOURS)"
        if policy.held_until is not None and now < policy.held_until:
            text += (f": it was lowered to {policy.cooldown_set:g} hours, which binds from "
                     f"{timezone.localtime(policy.held_until):%Y-%m-%d %H:%M %Z}, once the "
                     "cool-down it replaced has run its course")
        return text

    @admin.display(description="last changed")
    def changed(self, policy: GrantPolicy) -> str:
        if policy.changed_at is None:
            return "never"
        who = policy.changed_by.get_username() if policy.changed_by else "a deleted user"
        return f"by {who} at {timezone.localtime(policy.changed_at):%Y-%m-%d %H:%M %Z}"

    def save_model(self, request: HttpRequest, obj: GrantPolicy, form: Any,
                   change: bool) -> None:
        grant_policy_set(cooldown_hours=form.cleaned_data["cooldown_hours"],
                         by=request.user)  # type: ignore[arg-type]


@admin.register(AuditEntry)
class AuditEntryAdmin(RecordAdmin):
    list_display = ["created_at", "actor_label", "action", "object_type", "object_id"]
    list_filter = ["action"]


class WorkerAddForm(forms.ModelForm):  # type: ignore[type-arg]
    queues_text = forms.CharField(
        label="Queues", initial="experiments",
        help_text="The Celery queues it consumes, comma-separated, such as "
                  "experiments, experiments.gpu (add agent for a worker that runs agent steps).")

    class Meta:
        model = Worker
        fields = ["name"]

    def clean_queues_text(self) -> list[str]:
        try:
            return queues_parse(self.cleaned_data["queues_text"])
        except DomainError as exc:
            raise forms.ValidationError(str(exc)) from None


@admin.register(Worker)
class WorkerAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Workers on other hosts: registered here (the token is shown once, in a message),
    revoked by an action; nothing else is edited, and nothing is deleted (the audit log
    names them)."""

    list_display = ["name", "host", "queues", "state", "version", "last_seen_at", "revoked_at"]
    actions = ["revoke"]
    readonly = ["name", "queues", "token_prefix", "created_by", "created_at", "revoked_at",
                "revoked_by", "host", "version", "accelerators", "pid", "running",
                "last_seen_at"]

    @admin.display(description="state")
    def state(self, worker: Worker) -> str:
        return worker_state(worker)

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False,
                 **kwargs: Any) -> Any:
        if obj is None:
            kwargs["form"] = WorkerAddForm
        return super().get_form(request, obj, change=change, **kwargs)

    def get_fields(self, request: HttpRequest, obj: Any = None) -> list[Any]:
        return ["name", "queues_text"] if obj is None else self.readonly

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [] if obj is None else self.readonly

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: Worker, form: Any, change: bool) -> None:
        if change:
            return  # nothing on a worker's page is editable
        worker, token = worker_register(name=form.cleaned_data["name"],
                                        queues=form.cleaned_data["queues_text"],
                                        by=request.user)  # type: ignore[arg-type]
        obj.pk, obj.queues = worker.pk, worker.queues
        obj._state.adding = False
        self.message_user(request, f"Worker {worker.name} is registered. Its token, shown this "
                          f"once (set it as INFRAOPS_WORKER_TOKEN on the worker's host): {token}",
                          messages.WARNING)

    @admin.action(description="Revoke the selected workers (their tokens are refused from now on)",
                  permissions=["change"])
    def revoke(self, request: HttpRequest, queryset: QuerySet[Worker]) -> None:
        for worker in queryset:
            worker_revoke(worker=worker, by=request.user)  # type: ignore[arg-type]
        self.message_user(request, f"Revoked: {', '.join(w.name for w in queryset)}.")


class GrantsAuditedUserAdmin(UserAdmin):  # type: ignore[type-arg]
    """Django's user admin, where every grant of a role (a group) or of superuser status is
    an audit entry, and a superuser grant records who made it and when (infraops.grants):
    an account made and promoted here by a run's starter never reviews that starter's work."""

    def save_model(self, request: HttpRequest, obj: User, form: Any, change: bool) -> None:
        before = User.objects.filter(pk=obj.pk).first() if change else None
        form.grants_before = (  # groups are saved later, in save_related
            set(before.groups.values_list("name", flat=True)) if before else set(),
            bool(before and before.is_superuser))
        super().save_model(request, obj, form, change)

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        super().save_related(request, form, formsets, change)
        roles, superuser = form.grants_before
        user = form.instance
        roles_changed_audit(user=user, before=roles, superuser_before=superuser,
                            after=set(user.groups.values_list("name", flat=True)),
                            by=request.user)  # type: ignore[arg-type]


admin.site.unregister(User)
admin.site.register(User, GrantsAuditedUserAdmin)
