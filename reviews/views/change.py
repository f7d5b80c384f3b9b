"""The change page, where reviewers see the gate, the diff beside its evidence, and decide."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import messages
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from infraops.access import AuthenticatedHttpRequest, read_visible_or_404
from infraops.dbretry import TRANSIENT, retried
from infraops.errors import DomainError, Forbidden
from infraops.fragments import charts_html
from infraops.ratelimit import APPROVE, throttled
from infraops.reads import JoinedRead
from reviews.diff_render import render_diff
from reviews.models import Change, ReviewDecision, grants_for_page
from reviews.services import (
    change_comment,
    change_gate_read,
    change_merge_request,
    change_refusal,
    decision_denial,
    review_decide,
)
from reviews.services.decide import MAX_COMMENT, MERGE_TRIES_IN_REQUEST, decider_rights

SHA256 = r"[0-9a-f]{64}"


class DecisionForm(forms.Form):
    decision = forms.ChoiceField(choices=ReviewDecision.Decision.choices)
    comment = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 3}),
                              max_length=MAX_COMMENT,
                              label="Comment (goes back to the agent)",
                              help_text="To its run while it runs; once it ended, to a run "
                                        "at work on the same goal, else as the first message "
                                        "of a follow-up run.")
    diff_sha256 = forms.RegexField(regex=SHA256, widget=forms.HiddenInput)
    override_reason = forms.CharField(
        required=False, max_length=MAX_COMMENT, widget=forms.Textarea(attrs={"rows": 2}),
        label="Why merge over the failing checks (recorded with the decision)")


class CommentForm(forms.Form):
    path = forms.CharField(max_length=1000, widget=forms.HiddenInput)
    line = forms.IntegerField(min_value=1, widget=forms.HiddenInput)
    side = forms.ChoiceField(choices=[("new", "new"), ("old", "old")], widget=forms.HiddenInput)
    text = forms.CharField(max_length=MAX_COMMENT, widget=forms.Textarea(attrs={"rows": 2}),
                           label="Comment on this line")


# A change with what its page shows of it: target, author, goal and both experiments.
CHANGE_READ = JoinedRead(Change, "target", "requested_by", "goal_version__goal", "experiment",
                         "reverify_experiment")


def _get_change_for_user(request: AuthenticatedHttpRequest, pk: int, attempt: str = "") -> Change:
    """The change, or 404; an `attempt` (approve, merge…) at a change of a target the user
    does not see is audited as refused, as every other refusal is."""
    try:
        return read_visible_or_404(CHANGE_READ, request, pk)
    except Http404:
        unseen = Change.objects.filter(pk=pk).first() if attempt else None
        if unseen is not None and request.user.is_authenticated:
            change_refusal(request.user, unseen, attempt, "not a member of the change's target")
        raise


def _refused(request: AuthenticatedHttpRequest, change: Change, reason: str) -> HttpResponse:
    return render(request, "reviews/refused.html", {"change": change, "reason": reason},
                  status=403)


def _commenting(request: AuthenticatedHttpRequest) -> tuple[str, str, int] | None:
    """?comment=<side>:<line>:<path> opens the comment form on that line."""
    side, _, rest = request.GET.get("comment", "").partition(":")
    line, _, path = rest.partition(":")
    return (path, side, int(line)) if side in ("new", "old") and line.isdigit() and path else None


def _context(request: AuthenticatedHttpRequest, change: Change, **forms_: Any) -> dict[str, Any]:
    comments = [{"path": c.path, "line": c.line, "side": c.side, "text": c.text,
                 "author": str(c.author), "created_at": c.created_at,
                 "outdated": c.diff_sha256 != change.diff_sha256}
                for c in change.comments.select_related("author")]
    denial = decision_denial(request.user, change)
    decisions = list(change.decisions.select_related("reviewer"))
    return {
        "change": change, "checks": change.checks, "failing": change.failing_checks,
        "review": change.review_checks, "overridable": change.overridable_checks,
        "diff_files": render_diff(change.diff, change.risk, comments),
        "decisions": decisions,
        "approval": change.valid_approval(decisions),
        "can_decide": denial is None, "decide_denial": denial,
        "my_rights": grants_for_page(decider_rights(request.user, change)),
        "form": forms_.get("form") or DecisionForm(initial={"diff_sha256": change.diff_sha256}),
        "comment_form": forms_.get("comment_form") or CommentForm(),
        "commenting": _commenting(request),
        "charts": charts_html(change.experiment),
        "runs": change.runs.select_related("goal_version"),
    }


def change_detail(request: AuthenticatedHttpRequest, pk: int) -> HttpResponse:
    change = change_gate_read(change=_get_change_for_user(request, pk))
    template = "reviews/change.html#gate-checks" if request.htmx else "reviews/change.html"
    return render(request, template, _context(request, change))


@require_POST
def change_decide(request: AuthenticatedHttpRequest, pk: int) -> HttpResponse:
    asked = request.POST.get("decision", "")
    change = _get_change_for_user(
        request, pk, attempt=asked if asked in ReviewDecision.Decision.values else "decide")
    if request.POST.get("decision") == ReviewDecision.Decision.APPROVE and (
            refused := throttled(request, APPROVE)) is not None:
        return refused
    form = DecisionForm(request.POST)
    if not form.is_valid():
        messages.error(request, _errors(form))
        return redirect("reviews:change", pk=change.pk)
    try:
        review_decide(change=change, reviewer=request.user,
                      decision=form.cleaned_data["decision"], comment=form.cleaned_data["comment"],
                      diff_sha256=form.cleaned_data["diff_sha256"],
                      override_reason=form.cleaned_data["override_reason"])
    except Forbidden as exc:
        return _refused(request, change, str(exc))
    except DomainError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, _decided(change))
    return redirect("reviews:change", pk=change.pk)


def _decided(change: Change) -> str:
    """What the reviewer reads once their decision is committed. A database that fails from
    here on must not answer as if nothing were recorded (a 503): the merge's steps are
    idempotent, and beat's changes_reap finishes what this request could not."""
    try:
        retried(change.refresh_from_db, what=f"change {change.pk} read",
                tries=MERGE_TRIES_IN_REQUEST)
    except TRANSIENT:
        return (f"Change {change.pk}: your decision is recorded. The database connection "
                "dropped while the change was merging: the merge is finished in the "
                "background within seconds; reload this page to see it.")
    if change.status in (Change.Status.APPROVED, Change.Status.MERGING):
        return (f"Change {change.pk}: {change.get_status_display()}; the merge is finished "
                "in the background within seconds: reload this page to see it.")
    return f"Change {change.pk}: {change.get_status_display()}."


@require_POST
def change_merge(request: AuthenticatedHttpRequest, pk: int) -> HttpResponse:
    change = _get_change_for_user(request, pk, attempt="merge")
    try:
        change = change_merge_request(change=change, user=request.user)
    except Forbidden as exc:
        return _refused(request, change, str(exc))
    except DomainError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Change {change.pk}: {change.get_status_display()}.")
    return redirect("reviews:change", pk=change.pk)


@require_POST
def change_add_comment(request: AuthenticatedHttpRequest, pk: int) -> HttpResponse:
    change = _get_change_for_user(request, pk, attempt="comment")
    form = CommentForm(request.POST)
    if not form.is_valid():
        messages.error(request, "The comment was not saved: " + _errors(form))
        return redirect("reviews:change", pk=change.pk)
    try:
        change_comment(change=change, author=request.user, **form.cleaned_data)
    except Forbidden as exc:
        return _refused(request, change, str(exc))
    except DomainError as exc:
        messages.error(request, f"The comment was not saved: {exc}")
    else:
        messages.success(request, f"Comment saved on {form.cleaned_data['path']} line "
                                  f"{form.cleaned_data['line']}; the agent reads it next step.")
    return redirect("reviews:change", pk=change.pk)


def _errors(form: forms.Form) -> str:
    if "decision" in form.errors:
        return "Choose approve, reject or request changes."
    labels = {"diff_sha256": "the page is out of date, reload it"}
    return "; ".join(labels[name] if name in labels
                     else f"{name}: {' '.join(str(e) for e in errors)}"
                     for name, errors in form.errors.items())
