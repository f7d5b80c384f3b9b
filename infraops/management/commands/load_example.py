"""manage.py load_example: register the bundled example target with a goal. Idempotent."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from infraops import gitops
from infraops.errors import DomainError
from infraops.models import AcceptanceCriterion, Boundary, Goal, Target
from infraops.services.goals import goal_snapshot
from infraops.services.targets import target_add_role_holders, target_register

EXAMPLES = Path(settings.BASE_DIR) / "examples"


class Command(BaseCommand):
    help = "Register examples/tiny-serving as a target (a bare repo in the data folder)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--name", default="tiny-serving")

    def handle(self, *args: Any, **options: Any) -> None:
        name = options["name"]
        source = EXAMPLES / name
        if not (source / "infraops.toml").is_file():
            raise CommandError(f"No example named {name!r} in {EXAMPLES}.")
        origin = Path(settings.DATA_DIR) / "examples" / f"{name}.git"
        if not origin.exists():
            origin.parent.mkdir(parents=True, exist_ok=True)
            gitops.repo_init_from_dir(source, origin, branch="main",
                                      message=f"{name}: the bundled example")
        target = Target.objects.filter(name=name).first()
        if target is None:
            try:
                target = target_register(name=name, repo_url=str(origin), base_branch="main",
                                         push_on_merge=True)
            except DomainError as exc:
                raise CommandError(str(exc)) from None
        goal, created = Goal.objects.get_or_create(
            target=target, name="Lower per-request latency",
            defaults={"probe": "latency-bench", "metric": "latency_ms", "direction": "minimize",
                      "relative_target": 0.10, "policy": Goal.Policy.TUNER},
        )
        if created:
            Boundary.objects.create(goal=goal, editable_paths="config/**", max_experiments=8,
                                    max_steps=40, max_diff_lines=20)
            AcceptanceCriterion.objects.create(
                goal=goal, kind=AcceptanceCriterion.Kind.RELATIVE, probe="latency-bench",
                metric="latency_ms", comparison="<=", value=-0.05)
            goal_snapshot(goal=goal)
        # The first users (standalone makes them before the example) see it in their role.
        joined = target_add_role_holders(target=target)
        names = ", ".join(user.get_username() for user in joined)
        members = f"; members added: {names}" if joined else ""
        self.stdout.write(f"Example target {target.name} ready ({origin}), goal {goal.name!r}"
                          f"{members}.")
