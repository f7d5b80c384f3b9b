"""Runs on pages of the core app (whose Python does not import agents): a target's recent
runs, and the run already active on a goal."""

from __future__ import annotations

from typing import Any

from django import template

from agents.models import AgentRun
from infraops.models import Goal, Target

register = template.Library()

ACTIVE = (AgentRun.Status.RUNNING, AgentRun.Status.PAUSED)


@register.inclusion_tag("agents/target_runs.html")
def target_runs(target: Target) -> dict[str, Any]:
    runs = (AgentRun.objects.filter(target=target)
            .select_related("goal_version__goal__target", "started_by")[:20])
    return {"runs": runs}


@register.simple_tag
def active_run(goal: Goal) -> AgentRun | None:
    """The goal's running or paused run, if any: a second one would compete with it."""
    return AgentRun.objects.filter(goal_version__goal=goal, status__in=ACTIVE).order_by(
        "-created_at").first()
