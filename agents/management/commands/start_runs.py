"""manage.py start_runs TARGET [--goal NAME]: start a run on each goal of the target that has
never had one, as the first superuser (an LLM goal only where an endpoint is set; a goal whose
probe needs hardware only where a worker for it runs or is coming). The standalone's showcase
(`prepare` calls it): a newcomer watches the product work on the demo's three problems without
clicking anything."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from agents.models import AgentRun
from agents.services import run_start
from infraops.errors import DomainError
from infraops.experiments.accelerators import GPU
from infraops.experiments.services import queue_for
from infraops.experiments.workers import live_queues
from infraops.models import Goal


class Command(BaseCommand):
    help = "Start a run on each goal of TARGET that has never had one."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("target")
        parser.add_argument("--goal", action="append", default=[],
                            help="Only the goal of this name (repeatable).")

    def handle(self, *args: Any, **options: Any) -> None:
        user = get_user_model().objects.filter(is_superuser=True).order_by("pk").first()
        if user is None:
            raise CommandError("No superuser to start the runs as: run `manage.py prepare`.")
        goals = Goal.objects.filter(target__name=options["target"]).order_by("pk")
        if options["goal"]:
            goals = goals.filter(name__in=options["goal"])
        if not goals:
            raise CommandError(f"No goal on a target named {options['target']!r}"
                               + (f" named {', '.join(options['goal'])}." if options["goal"]
                                  else "."))
        live = live_queues() or set()
        # At verbosity 0 (a warm start's showcase) a goal left alone is not said again.
        say_why_not = options["verbosity"] >= 1
        for goal in goals:
            if AgentRun.objects.filter(goal_version__goal=goal).exists():
                continue
            why_not = _why_not_here(goal, live)
            if why_not:
                if say_why_not:
                    self.stdout.write(f"Not starting {goal.name!r}: {why_not}.")
                continue
            try:
                run = run_start(goal=goal, user=user)
            except DomainError as exc:
                self.stderr.write(f"Could not start a run on {goal.name!r}: {exc}")
                continue
            self.stdout.write(f"Started run {run.pk} on {goal.name!r}.")


def _why_not_here(goal: Goal, live: set[str]) -> str | None:
    """Why the goal cannot run here: no LLM endpoint for an LLM goal, or no worker for its
    probe's hardware; None when it can."""
    if goal.policy == Goal.Policy.LLM and not settings.OPENAI_BASE_URL:
        return "it needs an LLM endpoint (OPENAI_BASE_URL, or `standalone --demo-llm`)"
    return _missing_worker(goal, live)


def _missing_worker(goal: Goal, live: set[str]) -> str | None:
    """Why no worker could serve the goal's probe, when it needs hardware that no live worker
    has and no GPU worker is about to start (settings.GPU_WORKER); None when one can."""
    manifest = goal.target.manifest()
    probe = manifest.probe(goal.probe) if manifest is not None else None
    if probe is None or not probe.requires:
        return None
    queue = queue_for([probe])
    if queue in live or (settings.GPU_WORKER
                                            and queue == f"experiments.{GPU}"):
        return None
    return (f"its probe {probe.name!r} needs a worker with {' and '.join(probe.requires)} "
            f"(queue {queue}), and none runs here")
