"""The change page, where reviewers see the gate, the diff beside its evidence, and decide."""

from __future__ import annotations

import hashlib
import json
from typing import Any, cast

from django import forms
from django.contrib import messages
from django.core.cache import caches
from django.db.models import ForeignKey, ManyToManyRel, Model
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.utils.safestring import SafeString, mark_safe
from django.views.decorators.http import require_POST

from infraops.access import AuthenticatedHttpRequest, read_visible_or_404
from infraops.dbretry import TRANSIENT, retried
from infraops.errors import DomainError, Forbidden
from infraops.fragments import charts_html
from infraops.ratelimit import APPROVE, throttled
from infraops.reads import JoinedRead
from reviews.diff_render import render_diff
from reviews.models import Change, ReviewComment, ReviewDecision, grants_for_page
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
DIFF_TEMPLATE = "reviews/_diff.html"


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
# What the page lists of the change, each a statement built once per process (building the
# ORM's SQL for these four reads was a fifth of the page's web CPU on bench/load.py).
DECISIONS_READ = JoinedRead(ReviewDecision, "reviewer", where='t0."change_id" = %s',
                            order_by='t0."created_at", t0."id"')
COMMENTS_READ = JoinedRead(ReviewComment, "author", where='t0."change_id" = %s',
                           order_by='t0."created_at", t0."id"')


def _runs_read() -> JoinedRead[Model]:
    """The runs that submitted a change (the agents app's, through the relation it declares
    to changes), newest first, each with its goal version and goal."""
    relation = cast(ManyToManyRel, Change._meta.get_field("runs"))
    runs = cast(type[Model], relation.related_model)
    through = cast(type[Model], relation.through)._meta
    column = {f.related_model: f.column for f in through.concrete_fields
              if isinstance(f, ForeignKey)}
    # Identifiers from the models' metadata; the change is bound.
    return JoinedRead(
        runs, "goal_version__goal",
        where=f't0."id" IN (SELECT "{column[runs]}" FROM "{through.db_table}" '  # noqa: S608  # nosec B608
              f'WHERE "{column[Change]}" = %s)',
        order_by='t0."created_at" DESC, t0."id" DESC')


RUNS_READ = _runs_read()


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


def _diff_html(request: AuthenticatedHttpRequest, change: Change, can_decide: bool,
               commenting: tuple[str, str, int] | None, comment_form: forms.Form) -> SafeString:
    """The diff's tables (reviews/_diff.html): highlighted rows, risk notes, line comments,
    and the links that open the comment form where the reader may comment. Rendered once per
    web process for each state of what it shows (the `changes` cache): a diff of a few
    hundred lines cost the page more CPU than everything else on it, on every read. The key
    names the change (and its creation: a database that was reset and gave a pk again meets
    none of the old entries), its diff, its findings, its comments and whether the reader
    may comment; with the comment form open (it carries the request's CSRF token) the
    tables are rendered for this request only."""
    comments = COMMENTS_READ.all(change.pk)
    rows = [{"path": c.path, "line": c.line, "side": c.side, "text": c.text,
             "author": str(c.author), "created_at": c.created_at,
             "outdated": c.diff_sha256 != change.diff_sha256} for c in comments]
    if commenting is not None:
        return render_to_string(DIFF_TEMPLATE, {
            "change": change, "diff_files": render_diff(change.diff, change.risk, rows),
            "can_decide": can_decide, "commenting": commenting, "comment_form": comment_form,
        }, request)
    shown = json.dumps([change.risk, [(c.pk, c.author_id) for c in comments]],
                       sort_keys=True, default=str)
    key = ":".join(str(part) for part in (
        "diff", change.pk, change.created_at.timestamp(), change.diff_sha256,
        hashlib.sha256(shown.encode()).hexdigest(), can_decide))
    cache = caches["changes"]
    html: str | None = cache.get(key)
    if html is None:
        html = render_to_string(DIFF_TEMPLATE, {
            "change": change, "diff_files": render_diff(change.diff, change.risk, rows),
            "can_decide": can_decide})
        cache.set(key, html, timeout=None)
    # The template's own output, escaped where it shows data.
    return mark_safe(html)  # noqa: S308  # nosec


def _context(request: AuthenticatedHttpRequest, change: Change, **forms_: Any) -> dict[str, Any]:
    denial = decision_denial(request.user, change)
    decisions = DECISIONS_READ.all(change.pk)
    for decision in decisions:  # as change.decisions gives them: their change known
        ReviewDecision.change.field.set_cached_value(decision, change)
    commenting = _commenting(request)
    comment_form = forms_.get("comment_form") or CommentForm()
    return {
        "change": change, "checks": change.checks, "failing": change.failing_checks,
        "review": change.review_checks, "overridable": change.overridable_checks,
        "diff_html": _diff_html(request, change, denial is None, commenting, comment_form),
        "decisions": decisions,
        "approval": change.valid_approval(decisions),
        "can_decide": denial is None, "decide_denial": denial,
        "my_rights": grants_for_page(decider_rights(request.user, change)),
        "form": forms_.get("form") or DecisionForm(initial={"diff_sha256": change.diff_sha256}),
        "charts": charts_html(change.experiment),
        "runs": RUNS_READ.all(change.pk),
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
