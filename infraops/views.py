"""Dashboard, target and experiment pages, and a health check."""

from __future__ import annotations

from typing import Any

from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

from infraops.access import get_visible_or_404, target_roles
from infraops.experiments.services import reproduce_command
from infraops.experiments.workers import missing_worker_message
from infraops.feedback.charts import feedback_charts
from infraops.live import cursor
from infraops.models import Experiment, Target


def target_detail(request: HttpRequest, name: str) -> HttpResponse:
    target = get_visible_or_404(Target.objects.all(), request, path="", name=name)
    manifest = target.manifest()
    return render(request, "infraops/target.html", {
        "target": target, "manifest": manifest,
        "target_roles": target_roles(request.user, target.pk),
        "goals": target.goals.select_related("boundary").prefetch_related("criteria"),
        "experiments": target.experiments.all()[:20],
    })


def experiment_detail(request: HttpRequest, pk: int) -> HttpResponse:
    experiment = get_visible_or_404(Experiment.objects.select_related("target"), request, pk=pk)
    waiting = experiment.status == Experiment.Status.QUEUED
    manifest = experiment.target.manifest()
    executions = []
    for execution in experiment.executions.order_by("attempt", "id"):
        probe = manifest.probe(execution.probe) if manifest else None
        commit = (experiment.candidate_commit if execution.side == "candidate"
                  else experiment.baseline_commit)
        executions.append({"x": execution, "reproduce": reproduce_command(probe, execution, commit)
                           if probe is not None and execution.seed is not None else ""})
    return render(request, "infraops/experiment.html", {
        "experiment": experiment,
        "worker_warning": missing_worker_message(experiment.queue) if waiting else None,
        "executions": executions,
        # ?after=N (the live page fetching what a frame could not carry): the rows after N.
        "logs": experiment.logs.filter(seq__gt=cursor(request.GET.get("after")))
                .order_by("seq")[:2000],
        "charts": feedback_charts(experiment.feedback or {}),
        "criteria": criteria_rows(experiment),
    })


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
