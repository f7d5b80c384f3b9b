"""The skeleton library's pages: the list with its search and filters, a skeleton's page
(its conditions in words, transformation, costs, provenance, evidence and record), and its
promotion. The library belongs to no target; what it shows of experiments, changes and runs
is only what the reader's targets hold, and a draft proposed from a change only to who sees
that change's target (SkeletonQuerySet.visible_to)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.db.models import Case, IntegerField, Q, QuerySet, Value, When
from django.http import Http404, HttpResponse, QueryDict
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from infraops.access import (
    NOT_FOUND,
    AuthenticatedHttpRequest,
    require_any_role,
    visible_target_ids,
)
from infraops.errors import DomainError, Forbidden
from skeletons.applicability import describe_conditions
from skeletons.models import (
    Skeleton,
    SkeletonEvidence,
    SkeletonQuerySet,
    SkeletonUse,
    usage_of,
)
from skeletons.services import promotion_denial, skeleton_promote, trust_denial

MAX_LISTED = 200  # the library is small; past this the page asks for a narrower search
MAX_USES_SHOWN = 50
_RANK = Case(When(status=Skeleton.Status.TRUSTED, then=Value(0)),
             When(status=Skeleton.Status.REVIEWED, then=Value(1)),
             default=Value(2), output_field=IntegerField())


class SkeletonFilterForm(forms.Form):
    q = forms.CharField(label="Search", max_length=200, required=False,
                        widget=forms.SearchInput(attrs={"placeholder": "GIL, tf32, tile…"}),
                        error_messages={"max_length": "a search is at most 200 characters."})
    status = forms.ChoiceField(
        choices=[("", "any status"), *Skeleton.Status.choices], required=False,
        error_messages={"invalid_choice": "“%(value)s” is not a status."})
    field = forms.ChoiceField(
        label="With a condition on", required=False,
        error_messages={"invalid_choice": "no skeleton has a condition on “%(value)s”."})

    def __init__(self, query: QueryDict, fields: list[str]) -> None:
        super().__init__(query)
        field = self.fields["field"]
        assert isinstance(field, forms.ChoiceField)
        field.choices = [("", "any field"), *((name, name) for name in fields)]

    def filters(self) -> dict[str, str]:
        """The valid filters; an invalid one is left out (and named by problems())."""
        self.is_valid()
        found = {"q": "", "status": "", "field": ""}
        found.update({k: v for k, v in self.cleaned_data.items() if v})
        return found

    def problems(self) -> list[str]:
        return [f"{name}: {' '.join(str(e) for e in errors)}"
                for name, errors in self.errors.items()]


class PromoteForm(forms.Form):
    expected = forms.ChoiceField(choices=Skeleton.Status.choices, widget=forms.HiddenInput)


def _library(request: AuthenticatedHttpRequest) -> SkeletonQuerySet:
    """The skeletons the user may read (403 without any role)."""
    require_any_role(request)
    return Skeleton.objects.visible_to(visible_target_ids(request.user))


def _get_skeleton_for_user(request: AuthenticatedHttpRequest, slug: str) -> Skeleton:
    found = _library(request).select_related("proposed_from__target", "promoted_by").filter(
        slug=slug).first()
    if found is None:
        raise Http404(NOT_FOUND)
    return found


def skeleton_list(request: AuthenticatedHttpRequest) -> HttpResponse:
    library = _library(request)
    form = SkeletonFilterForm(request.GET, condition_fields(library))
    filters = form.filters()
    found = library.search(filters["q"])
    if filters["status"]:
        found = found.filter(status=filters["status"])
    if filters["field"]:
        found = found.with_field(filters["field"])
    skeletons = list(found.order_by(_RANK, "name")[:MAX_LISTED + 1])
    usage = usage_of([s.pk for s in skeletons[:MAX_LISTED]])
    rows = [{"skeleton": s, "conditions": describe_conditions(s.applicability),
             "usage": usage[s.pk]} for s in skeletons[:MAX_LISTED]]
    context = {"form": form, "problems": form.problems(), "rows": rows,
               "more": len(skeletons) > MAX_LISTED, "filtered": any(filters.values())}
    wants_table = request.htmx and not request.htmx.boosted and \
        request.htmx.target in (None, "skeleton-table")
    template = "skeletons/list.html#skeleton-table" if wants_table else \
        "skeletons/list.html"
    return render(request, template, context)


def condition_fields(library: QuerySet[Skeleton]) -> list[str]:
    """The fields the library's conditions name, sorted: the filter's choices."""
    fields = {item.get("field") for conditions in library.values_list("applicability", flat=True)
              if isinstance(conditions, list) for item in conditions if isinstance(item, dict)}
    return sorted(field for field in fields if isinstance(field, str))


def skeleton_detail(request: AuthenticatedHttpRequest, slug: str) -> HttpResponse:
    skeleton = _get_skeleton_for_user(request, slug)
    return render(request, "skeletons/detail.html",
                  _detail_context(request, skeleton))


def _detail_context(request: AuthenticatedHttpRequest, skeleton: Skeleton) -> dict[str, Any]:
    target_ids = visible_target_ids(request.user)
    denial = promotion_denial(request.user)
    if denial is None and skeleton.next_status == Skeleton.Status.TRUSTED:
        denial = trust_denial(skeleton)
    source = skeleton.proposed_from
    return {
        "skeleton": skeleton, "conditions": describe_conditions(skeleton.applicability),
        "evidence": _visible_evidence(skeleton, target_ids),
        "uses": _visible_uses(skeleton, target_ids), "usage": skeleton.usage(),
        "source": source if source is not None and (
            target_ids is None or source.target_id in target_ids) else None,
        "can_promote": denial is None and skeleton.next_status is not None,
        "promote_denial": denial, "promote_form": PromoteForm(
            initial={"expected": skeleton.status}),
    }


def _visible_evidence(skeleton: Skeleton, target_ids: list[int] | None
                      ) -> QuerySet[SkeletonEvidence]:
    rows = skeleton.evidence.select_related("experiment__target", "change__target")
    if target_ids is None:
        return rows
    return rows.filter(Q(experiment__isnull=True) | Q(experiment__target_id__in=target_ids),
                       Q(change__isnull=True) | Q(change__target_id__in=target_ids))


def _visible_uses(skeleton: Skeleton, target_ids: list[int] | None) -> QuerySet[SkeletonUse]:
    rows = skeleton.uses.select_related("run__target", "change")
    if target_ids is not None:
        rows = rows.filter(run__target_id__in=target_ids)
    return rows[:MAX_USES_SHOWN]


@require_POST
def skeleton_promote_view(request: AuthenticatedHttpRequest, slug: str) -> HttpResponse:
    skeleton = _get_skeleton_for_user(request, slug)
    form = PromoteForm(request.POST)
    if not form.is_valid():
        messages.error(request, "The page is out of date: reload it, then promote again. "
                                "Nothing was changed.")
        return redirect("skeletons:detail", slug=skeleton.slug)
    try:
        skeleton = skeleton_promote(skeleton=skeleton, user=request.user,
                                    expected=form.cleaned_data["expected"])
    except Forbidden as exc:
        raise PermissionDenied(str(exc)) from None
    except DomainError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"{skeleton.name} is {skeleton.status} now.")
    return redirect("skeletons:detail", slug=skeleton.slug)
