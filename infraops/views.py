"""Dashboard, target and experiment pages, and a health check."""

from __future__ import annotations

from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, render

from infraops.access import require_any_role
from infraops.charts import feedback_charts
from infraops.models import Experiment, Target
from infraops.workers import missing_worker_message


def target_detail(request: HttpRequest, name: str) -> HttpResponse:
    require_any_role(request)
    target = get_object_or_404(Target, name=name)
    manifest = target.manifest()
    return render(request, "infraops/target.html", {
        "target": target, "manifest": manifest,
        "goals": target.goals.select_related("boundary").prefetch_related("criteria"),
        "experiments": target.experiments.all()[:20],
    })


def experiment_detail(request: HttpRequest, pk: int) -> HttpResponse:
    require_any_role(request)
    experiment = get_object_or_404(Experiment.objects.select_related("target"), pk=pk)
    waiting = experiment.status == Experiment.Status.QUEUED
    return render(request, "infraops/experiment.html", {
        "experiment": experiment,
        "worker_warning": missing_worker_message(experiment.queue) if waiting else None,
        "executions": experiment.executions.order_by("attempt", "id"),
        "logs": experiment.logs.order_by("seq")[:2000],
        "charts": feedback_charts(experiment.feedback or {}),
    })


def healthz(request: HttpRequest) -> JsonResponse:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return JsonResponse({"ok": True})
