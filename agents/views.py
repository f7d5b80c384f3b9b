"""Run pages: start, watch live, pause, resume, cancel."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import messages
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from agents import services
from agents.models import AgentRun
from infraops.access import HtmxHttpRequest, require_any_role
from infraops.errors import DomainError
from infraops.models import Experiment, Goal, Target
from infraops.workers import missing_worker_message
from reviews.models import Change


def dashboard(request: HtmxHttpRequest) -> HttpResponse:
    require_any_role(request)
    return render(request, "agents/dashboard.html", {
        "targets": Target.objects.all(),
        "runs": AgentRun.objects.select_related("goal_version__goal", "target", "started_by")[:20],
        "pending_reviews": Change.objects.awaiting_review().count(),
    })


def _get_run_for_user(request: HtmxHttpRequest, pk: int) -> AgentRun:
    require_any_role(request)
    return get_object_or_404(
        AgentRun.objects.select_related("goal_version__goal", "target", "started_by"), pk=pk
    )


@require_POST
def run_start(request: HtmxHttpRequest, goal_id: int) -> HttpResponse:
    goal = get_object_or_404(Goal.objects.select_related("target"), pk=goal_id)
    try:
        run = services.run_start(goal=goal, user=request.user)
    except DomainError as exc:
        messages.error(request, str(exc))
        return redirect("infraops:target", name=goal.target.name)
    return redirect("agents:run", pk=run.pk)


def run_detail(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    run = _get_run_for_user(request, pk)
    after_text = request.GET.get("after", "0")
    after = int(after_text) if after_text.isdigit() else 0
    events = run.events.filter(seq__gt=after).order_by("seq")
    context = {
        "run": run, "events": events, "worker_warning": _worker_warning(run),
        "steps": run.steps.order_by("number"),
        "changes": run.changes.order_by("pk"), "experiments": run.experiments.order_by("pk"),
        "hypotheses": run.hypotheses.select_related("author"),
        "run_messages": run.messages.select_related("author"), "steer_form": SteerForm(),
    }
    if request.htmx:
        return render(request, "agents/run.html#live-update", context)
    return render(request, "agents/run.html", context)


class SteerForm(forms.Form):
    kind = forms.ChoiceField(choices=[("message", "message"), ("hypothesis", "hypothesis")])
    text = forms.CharField(max_length=4000, widget=forms.Textarea(attrs={"rows": 2}))
    title = forms.CharField(max_length=200, required=False)

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("kind") == "hypothesis" and not data.get("title"):
            self.add_error("title", "A hypothesis needs a title.")
        return data


@require_POST
def run_steer(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    run = _get_run_for_user(request, pk)
    form = SteerForm(request.POST)
    if not form.is_valid():
        messages.error(request, " ".join(str(e) for errors in form.errors.values() for e in errors))
        return redirect("agents:run", pk=run.pk)
    try:
        if form.cleaned_data["kind"] == "hypothesis":
            services.hypothesis_add(run=run, user=request.user, title=form.cleaned_data["title"],
                                    rationale=form.cleaned_data["text"])
        else:
            services.run_message_add(run=run, user=request.user, text=form.cleaned_data["text"])
    except DomainError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, "Sent: the agent receives it at its next step.")
    return redirect("agents:run", pk=run.pk)


def _worker_warning(run: AgentRun) -> str | None:
    """Why nothing moves, when no worker consumes the queue the run now waits on."""
    if run.status != AgentRun.Status.RUNNING:
        return None
    waiting = run.state.get("waiting_for")
    queue = "agent"
    if waiting:
        queue = (Experiment.objects.filter(pk=waiting, status=Experiment.Status.QUEUED)
                 .values_list("queue", flat=True).first() or "agent")
    return missing_worker_message(queue)


@require_POST
def run_control(request: HtmxHttpRequest, pk: int, action: str) -> HttpResponse:
    run = _get_run_for_user(request, pk)
    control = {"pause": services.run_pause, "resume": services.run_resume,
               "cancel": services.run_cancel}.get(action)
    if control is None:
        return HttpResponse(f"Unknown action {action!r}.", status=400)
    try:
        run = control(run=run, user=request.user)
    except DomainError as exc:
        if request.htmx:
            return HttpResponse(str(exc), status=409)
        messages.error(request, str(exc))
    if request.htmx:
        return render(request, "agents/run.html#run-controls", {"run": run})
    return redirect("agents:run", pk=run.pk)
