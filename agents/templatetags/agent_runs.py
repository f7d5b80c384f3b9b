"""Runs on pages of the core app (whose Python does not import agents): a target's recent
runs, the run already active on a goal, the runs and changes of an experiment; and a run's
chart of trials."""

from __future__ import annotations

from typing import Any

from django import template
from django.utils.safestring import SafeString

from agents.charts import trials_svg
from agents.models import AgentRun
from infraops.models import Experiment, Goal, Target
from reviews.models import Change

register = template.Library()


@register.inclusion_tag("agents/target_runs.html")
def target_runs(target: Target) -> dict[str, Any]:
    runs = (AgentRun.objects.filter(target=target)
            .select_related("goal_version__goal__target", "started_by")[:20])
    return {"runs": runs}


@register.inclusion_tag("agents/experiment_links.html")
def experiment_links(experiment: Experiment) -> dict[str, Any]:
    """The runs that asked for the experiment and the changes it is the evidence of."""
    return {"runs": list(AgentRun.objects.filter(experiments=experiment)
                         .order_by("pk").values_list("pk", flat=True)[:20]),
            "changes": list(Change.objects.filter(experiment=experiment)
                            .order_by("pk").values_list("pk", "title")[:20])}


@register.simple_tag
def active_run(goal: Goal) -> AgentRun | None:
    """The goal's running or paused run, if any: a second one would compete with it."""
    return (AgentRun.objects.filter(goal_version__goal=goal,
                                    status__in=AgentRun.active_statuses())
            .order_by("-created_at").first())


@register.filter
def trials_chart(run: AgentRun) -> SafeString:
    """The tuner's trials of the run as an SVG chart (agents.charts); empty for other runs."""
    trials = run.state.get("trials") if isinstance(run.state, dict) else None
    return trials_svg(trials if isinstance(trials, list) else [])
