"""What the agents app draws on the core's pages (infraops.panels): a goal's run controls and
the target's runs on the target page; the runs and changes of an experiment on its page."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from django.db import connections, router
from django.template import Context

from agents.models import AgentRun
from infraops.models import Experiment, Goal, Target
from infraops.panels import panel_register
from infraops.roles import ENGINEER


def goal_controls(page: Context, goal: Goal) -> dict[str, Any] | None:
    """The target page's run controls of a goal (start_controls)."""
    return start_controls(goal, page.get("target_roles") or ())


def start_controls(goal: Goal, target_roles: Collection[str]) -> dict[str, Any] | None:
    """Start a run, saying so when one is already active on the goal (engineers only): drawn
    on the target page and on the goal's own page, where a reader of its progress would look."""
    if ENGINEER not in target_roles:
        return None
    active = (AgentRun.objects.filter(goal_version__goal=goal,
                                      status__in=AgentRun.active_statuses())
              .order_by("-created_at").first())
    return {"goal": goal, "active": active}


def target_runs(page: Context, target: Target) -> dict[str, Any]:
    return {"runs": AgentRun.objects.filter(target=target)
            .select_related("goal_version__goal__target", "started_by")[:20]}


# The experiment page's links, as literal statements (bandit, B608): the ORM built these two
# queries on every read of the page for more CPU than PostgreSQL spent on them (bench/load.py).
_EXPERIMENT_RUNS = """SELECT agentrun_id FROM agents_agentrun_experiments
WHERE experiment_id = %s ORDER BY agentrun_id LIMIT 20"""
_EXPERIMENT_CHANGES = """SELECT id, title FROM reviews_change
WHERE experiment_id = %s ORDER BY id LIMIT 20"""


def experiment_links(page: Context, experiment: Experiment) -> dict[str, Any]:
    """The runs that asked for the experiment and the changes it is the evidence of."""
    with connections[router.db_for_read(AgentRun)].cursor() as cursor:
        cursor.execute(_EXPERIMENT_RUNS, [experiment.pk])
        runs = [pk for pk, in cursor.fetchall()]
        cursor.execute(_EXPERIMENT_CHANGES, [experiment.pk])
        changes = [(pk, title) for pk, title in cursor.fetchall()]
    return {"runs": runs, "changes": changes}


def panels_register() -> None:
    panel_register("target-goal", template="agents/goal_controls.html", context=goal_controls)
    panel_register("target", template="agents/target_runs.html", context=target_runs)
    panel_register("experiment", template="agents/experiment_links.html",
                   context=experiment_links)
