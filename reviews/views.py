"""The review queue and the change page, where reviewers decide."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from infraops.access import HtmxHttpRequest, require_any_role
from infraops.errors import DomainError
from reviews.diff_render import render_diff
from reviews.models import Change, ReviewDecision
from reviews.services import review_decide


class DecisionForm(forms.Form):
    decision = forms.ChoiceField(choices=ReviewDecision.Decision.choices)
    comment = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 3}),
                              max_length=10_000)


def _get_change_for_user(request: HtmxHttpRequest, pk: int) -> Change:
    require_any_role(request)
    return get_object_or_404(Change.objects.select_related("target", "requested_by"), pk=pk)


def queue(request: HtmxHttpRequest) -> HttpResponse:
    require_any_role(request)
    changes = Change.objects.select_related("target", "requested_by").order_by("-created_at")
    context = {"pending": changes.filter(status=Change.Status.PENDING_REVIEW),
               "decided": changes.exclude(status=Change.Status.PENDING_REVIEW)[:50]}
    template = "reviews/queue.html#queue-table" if request.htmx else "reviews/queue.html"
    return render(request, template, context)


def change_detail(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    change = _get_change_for_user(request, pk)
    return render(request, "reviews/change.html", {
        "change": change, "form": DecisionForm(),
        "diff_files": render_diff(change.diff, change.risk),
        "decisions": change.decisions.select_related("reviewer"),
    })


@require_POST
def change_decide(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    change = _get_change_for_user(request, pk)
    form = DecisionForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Choose approve, reject or request changes.")
        return redirect("reviews:change", pk=change.pk)
    try:
        review_decide(change=change, reviewer=request.user,
                      decision=form.cleaned_data["decision"], comment=form.cleaned_data["comment"])
    except DomainError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Change {change.pk}: {change.get_status_display()}.")
    return redirect("reviews:change", pk=change.pk)
