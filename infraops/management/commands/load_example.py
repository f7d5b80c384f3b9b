"""manage.py load_example [NAME]: register a bundled example as a target with its goals
(examples/NAME.goals.toml), each with its boundary and criteria. Idempotent: a second load
adds what is missing and changes nothing else. (`manage.py start_runs NAME` then starts a run
on each goal: the standalone's showcase.)

The first load makes the example's repository from its folder; a folder with a source.toml
is built from a pinned public release first (infraops/example_sources.py): its own files,
the installed release's packages checked against their RECORD, then the edits.
"""

from __future__ import annotations

import tempfile
import tomllib
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from infraops import example_sources, gitops
from infraops.errors import DomainError
from infraops.example_sources import ExampleSourceError
from infraops.models import AcceptanceCriterion, Boundary, Goal, Target
from infraops.services.goals import goal_snapshot
from infraops.services.targets import target_add_role_holders, target_register

EXAMPLES = Path(settings.BASE_DIR) / "examples"


class Command(BaseCommand):
    help = "Register a bundled example (examples/NAME) as a target with its goals."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("name", nargs="?", default="tiny-serving")
        parser.add_argument("--name", dest="name_option", help="The same as NAME (older form).")

    def handle(self, *args: Any, **options: Any) -> None:
        name = options["name_option"] or options["name"]
        source = EXAMPLES / name
        if not (source / "infraops.toml").is_file():
            raise CommandError(f"No example named {name!r} in {EXAMPLES}.")
        target, new_target = self._target(name, source)
        made = [self._goal(target, spec) for spec in _goal_specs(name)]
        goals = [goal for goal, _ in made]
        # The first users (standalone makes them before the example) see it in their role.
        joined = target_add_role_holders(target=target)
        if options["verbosity"] < 1 and not (new_target or joined or any(n for _, n in made)):
            return  # a warm start's load found everything in place: nothing new to say
        names = ", ".join(user.get_username() for user in joined)
        members = f"; members added: {names}" if joined else ""
        self.stdout.write(f"Example target {target.name} ready, goals: "
                          f"{', '.join(repr(g.name) for g in goals)}{members}.")

    def _target(self, name: str, source: Path) -> tuple[Target, bool]:
        """The example's target, and whether this load registered it."""
        origin = Path(settings.DATA_DIR) / "examples" / f"{name}.git"
        if not origin.exists():
            origin.parent.mkdir(parents=True, exist_ok=True)
            try:
                _repository_init(name, source, origin)
            except ExampleSourceError as exc:
                raise CommandError(f"Example {name}: {exc}") from None
        target = Target.objects.filter(name=name).first()
        if target is not None:
            return target, False
        try:
            return target_register(name=name, repo_url=str(origin), base_branch="main",
                                   push_on_merge=True, trusted_roots=[origin.parent]), True
        except DomainError as exc:
            raise CommandError(str(exc)) from None

    def _goal(self, target: Target, spec: dict[str, Any]) -> tuple[Goal, bool]:
        """The goal of that name, made with its boundary and criteria when it is new; and
        whether this load made it."""
        found = Goal.objects.filter(target=target, name=spec["name"]).first()
        if found is not None:
            return found, False
        fields = {k: v for k, v in spec.items() if k not in ("boundary", "criteria")}
        try:
            with transaction.atomic():
                goal = Goal(target=target, **fields)
                goal.full_clean()
                goal.save()
                boundary = Boundary(goal=goal, **spec.get("boundary", {}))
                boundary.full_clean()
                boundary.save()
                for criterion in spec.get("criteria", []):
                    made = AcceptanceCriterion(goal=goal, **criterion)
                    made.full_clean()
                    made.save()
                goal_snapshot(goal=goal)
        except (ValidationError, TypeError) as exc:
            raise CommandError(f"Goal {spec['name']!r} of {target.name}: {exc}") from None
        return goal, True


def _repository_init(name: str, source: Path, origin: Path) -> None:
    """The example's bare repository at ``origin``: one commit of its folder, or of the tree
    its source.toml builds (in a temporary folder, so a refused build leaves no repository)."""
    built_from = example_sources.source_read(source)
    if built_from is None:
        gitops.repo_init_from_dir(source, origin, branch="main",
                                  message=f"{name}: the bundled example")
        return
    with tempfile.TemporaryDirectory(prefix=f"infraops-example-{name}-") as tree:
        example_sources.tree_build(example=source, source=built_from, dest=Path(tree))
        gitops.repo_init_from_dir(Path(tree), origin, branch="main",
                                  message=example_sources.commit_message(name, built_from))


def _goal_specs(name: str) -> list[dict[str, Any]]:
    """examples/NAME.goals.toml's goals ([[goal]] tables with their boundary and criteria);
    none when the example has no such file."""
    path = EXAMPLES / f"{name}.goals.toml"
    if not path.is_file():
        return []
    try:
        goals = tomllib.loads(path.read_text())["goal"]
    except (tomllib.TOMLDecodeError, KeyError) as exc:
        raise CommandError(f"{path.name} is not a goals file ([[goal]] tables): {exc}") from None
    if not isinstance(goals, list):
        raise CommandError(f"{path.name}: 'goal' must be an array of tables ([[goal]]).")
    return goals
