"""Dashboard, target and experiment pages, and a health check."""

from __future__ import annotations

from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

from infraops.access import get_visible_or_404, target_roles
from infraops.charts import feedback_charts
from infraops.live import cursor
from infraops.models import Experiment, Target
from infraops.services.experiments import reproduce_command
from infraops.workers import missing_worker_message


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
    })


def healthz(request: HttpRequest) -> JsonResponse:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return JsonResponse({"ok": True})
