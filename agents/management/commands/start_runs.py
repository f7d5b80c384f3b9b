"""manage.py start_runs TARGET: start a run on each goal of the target that has never had one,
as the first superuser (an LLM goal only where an endpoint is set). The standalone's showcase
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
from infraops.models import Goal


class Command(BaseCommand):
    help = "Start a run on each goal of TARGET that has never had one."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("target")

    def handle(self, *args: Any, **options: Any) -> None:
        user = get_user_model().objects.filter(is_superuser=True).order_by("pk").first()
        if user is None:
            raise CommandError("No superuser to start the runs as: run `manage.py prepare`.")
        goals = Goal.objects.filter(target__name=options["target"]).order_by("pk")
        if not goals:
            raise CommandError(f"No goal on a target named {options['target']!r}.")
        for goal in goals:
            if AgentRun.objects.filter(goal_version__goal=goal).exists():
                continue
            if goal.policy == Goal.Policy.LLM and not settings.OPENAI_BASE_URL:
                self.stdout.write(f"Not starting {goal.name!r}: it needs an LLM endpoint "
                                  "(OPENAI_BASE_URL, or `standalone --demo-llm`).")
                continue
            try:
                run = run_start(goal=goal, user=user)
            except DomainError as exc:
                self.stderr.write(f"Could not start a run on {goal.name!r}: {exc}")
                continue
            self.stdout.write(f"Started run {run.pk} on {goal.name!r}.")
