"""Dashboard, target and experiment pages, a comparison of two revisions asked from the
target page, and a health check."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django import forms
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.db import connection, connections, router
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.utils.safestring import SafeString
from django.views.decorators.http import require_POST

from infraops.access import (
    AuthenticatedHttpRequest,
    get_visible_or_404,
    read_visible_or_404,
    target_roles,
)
from infraops.errors import QUEUE_DOWN, DomainError, Forbidden, queue_errors
from infraops.experiments.services import experiment_compare, reproduce_command
from infraops.experiments.workers import missing_worker_message
from infraops.fragments import charts_html, finished_part, rendered_once
from infraops.live import cursor
from infraops.models import Experiment, Target
from infraops.ratelimit import START_RUN, throttled
from infraops.reads import JoinedRead
from infraops.roles import ENGINEER


def target_detail(request: HttpRequest, name: str) -> HttpResponse:
    target = get_visible_or_404(Target.objects.all(), request, path="", name=name)
    manifest = target.manifest()
    roles = target_roles(request.user, target.pk)
    return render(request, "infraops/target.html", {
        "target": target, "manifest": manifest, "target_roles": roles,
        "goals": target.goals.select_related("boundary").prefetch_related("criteria"),
        "experiments": target.experiments.all()[:20],
        "compare_form": CompareForm(target=target) if ENGINEER in roles else None,
    })


class CompareForm(forms.Form):
    """Two revisions of a target to compare, and the probes to run (none: those covering the
    changed paths)."""

    candidate = forms.CharField(max_length=200, label="Candidate",
                                help_text="the revision to measure: a branch, tag or sha")
    base = forms.CharField(max_length=200, required=False, label="Against",
                           help_text="blank: the base branch's tip")

    def __init__(self, *args: Any, target: Target, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        manifest = target.manifest()
        self.fields["probes"] = forms.MultipleChoiceField(
            required=False, widget=forms.CheckboxSelectMultiple,
            choices=[(p.name, p.name) for p in (manifest.probes if manifest else ())],
            help_text="none ticked: those covering the change")
        self.fields["base"].widget.attrs["placeholder"] = target.base_branch


@require_POST
def target_compare(request: AuthenticatedHttpRequest, name: str) -> HttpResponse:
    """Queue an experiment of two revisions of the target (an engineer's), then show it."""
    target = get_visible_or_404(Target.objects.all(), request, path="", name=name)
    if (refused := throttled(request, START_RUN)) is not None:
        return refused
    form = CompareForm(request.POST, target=target)
    if not form.is_valid():
        messages.error(request, "; ".join(f"{name}: {' '.join(map(str, errors))}"
                                          for name, errors in form.errors.items()))
        return redirect("infraops:target", name=target.name)
    try:
        experiment = experiment_compare(target=target, user=request.user, fetch=False,
                                        **form.cleaned_data)
    except Forbidden as exc:
        raise PermissionDenied(str(exc)) from None
    except DomainError as exc:
        messages.error(request, str(exc))
        return redirect("infraops:target", name=target.name)
    except queue_errors():
        messages.error(request, f"{QUEUE_DOWN}: the experiment was recorded and is sent again "
                                "once it answers (see the list below).")
        return redirect("infraops:target", name=target.name)
    return redirect("infraops:experiment", pk=experiment.pk)


# An experiment with its target (the page links it and reads its manifest).
EXPERIMENT_READ = JoinedRead(Experiment, "target")


def experiment_detail(request: HttpRequest, pk: int) -> HttpResponse:
    experiment = read_visible_or_404(EXPERIMENT_READ, request, pk)
    waiting = experiment.status == Experiment.Status.QUEUED
    return render(request, "infraops/experiment.html", {
        "experiment": experiment,
        "worker_warning": missing_worker_message(experiment.queue) if waiting else None,
        "charts": charts_html(experiment),
        # ?after=N (the live page fetching what a frame could not carry): the rows after N.
        "log_rows": _log_rows(experiment, cursor(request.GET.get("after"))),
    } | _record(experiment))


def _record(experiment: Experiment) -> dict[str, Any]:
    """The context of the page's `record` partial (feedback, comparison, executions): once
    the experiment has finished, the partial itself, rendered once per process. The
    executions' reproduce commands follow the target's manifest, which the key names."""
    finished = finished_part(
        "record", experiment,
        lambda: render_to_string("infraops/experiment.html#record", _record_context(experiment)),
        experiment.target.manifest_sha256)
    return {"record": finished} if finished is not None else _record_context(experiment)


def _record_context(experiment: Experiment) -> dict[str, Any]:
    manifest = experiment.target.manifest()
    executions = []
    for execution in experiment.executions.order_by("attempt", "id").defer("stdout"):
        probe = manifest.probe(execution.probe) if manifest else None
        commit = (experiment.candidate_commit if execution.side == "candidate"
                  else experiment.baseline_commit)
        executions.append({"x": execution, "reproduce": reproduce_command(probe, execution, commit)
                           if probe is not None and execution.seed is not None else ""})
    return {"experiment": experiment, "executions": executions, "charts": charts_html(experiment),
            "criteria": criteria_rows(experiment)}


LOG_ROWS_SHOWN = 2000  # the most probe output rows a page shows at once
# Which output rows there are, as a literal statement (bandit, B608): the ORM's values_list
# cost more CPU than the query (bench/load.py).
_LOG_SEQS = """SELECT seq FROM infraops_experimentlog WHERE experiment_id = %s AND seq > %s
ORDER BY seq LIMIT %s"""


def _log_rows(experiment: Experiment, after: int) -> SafeString:
    """The probe output's rows after `after` (at most LOG_ROWS_SHOWN), each the `log-line`
    partial rendered once per process: a row is written once (infraops.experiments.results)
    and shows only itself. Which rows there are is one narrow query; a finished experiment's
    rows are one entry, named by the rows it holds."""
    with connections[router.db_for_read(Experiment)].cursor() as cursor:
        cursor.execute(_LOG_SEQS, [experiment.pk, after, LOG_ROWS_SHOWN])
        seqs = [seq for seq, in cursor.fetchall()]
    prefix = f"experiment-log:{experiment.pk}:{experiment.created_at.timestamp()}:"

    def fetch(wanted: set[int]) -> Iterable[tuple[int, dict[str, Any]]]:
        logs = experiment.logs.filter(seq__gte=min(wanted), seq__lte=max(wanted))
        return ((log.seq, {"log": log}) for log in logs if log.seq in wanted)

    def rows() -> SafeString:
        keys = {f"{prefix}{seq}": seq for seq in seqs}
        return rendered_once("infraops/experiment.html#log-line", keys, fetch)

    if not seqs:
        return SafeString("")
    return finished_part("log", experiment, rows, after, len(seqs), seqs[-1]) or rows()


def criteria_rows(experiment: Experiment) -> list[dict[str, Any]]:
    """The acceptance criteria the experiment was run against (its pinned goal version's), each
    with its verdict from the feedback: passed, failed, not run (a variant cell it needs was
    left out), or pending while the experiment runs."""
    judged = {}
    for finding in (experiment.feedback or {}).get("findings", []):
        evidence = finding.get("evidence") or {}
        if finding.get("layer") == "criteria" and "verdict" in evidence:
            judged[evidence.get("criterion") or evidence.get("name")] = finding
    rows = []
    for spec in experiment.criteria:
        finding = judged.get(spec.get("id") or spec.get("name"))
        verdict = (finding or {}).get("evidence", {}).get("verdict", {})
        if finding is None:
            state = "not judged" if experiment.is_finished else "pending"
        elif finding.get("kind") == "criterion-not-run":
            state = "not run"
        else:
            state = "passed" if verdict.get("passed") else "failed"
        rows.append({"name": spec.get("name") or "", "condition": spec.get("description") or "",
                     "state": state, "verdict": verdict})
    return rows


def healthz(request: HttpRequest) -> JsonResponse:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return JsonResponse({"ok": True})
