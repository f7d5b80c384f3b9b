"""manage.py prepare [--no-example] [--no-showcase]: what `standalone` does before it starts
its processes, in one process: migrate, collect the static files, create the first users on
the first start, load the example targets (tiny-serving, and demo-kernels with a goal per case
of docs/product.md) and, on the first start, the showcase: a run on each of the demo's goals
(`start_runs`), queued for the worker that standalone starts next.

One process instead of one per step: Django's start-up is paid once (a warm start of the
standalone spent most of its time starting Python for each step). The first users are made
when no superuser exists, asked of the database here rather than read from another process's
printed output.
"""

from __future__ import annotations

import time
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandParser

EXAMPLES = ("tiny-serving", "demo-kernels")


class Command(BaseCommand):
    help = "Migrate, collect static files, create the first users once, load the example."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--no-example", action="store_true")
        parser.add_argument("--no-showcase", action="store_true",
                            help="Load the demo, but start no run on it.")

    def handle(self, *args: Any, **options: Any) -> None:
        self._step("Migrating the database", call_command, "migrate", interactive=False,
                   verbosity=0)
        self._step("Collecting static files", call_command, "collectstatic", interactive=False,
                   verbosity=0)
        if not get_user_model().objects.filter(is_superuser=True).exists():
            self.stdout.write("First start: creating the users (passwords are shown only now).")
            call_command("adduser", "admin", role=["engineer"], admin=True, stdout=self.stdout)
            call_command("adduser", "reviewer", role=["reviewer"], stdout=self.stdout)
        if options["no_example"]:
            return
        for example in EXAMPLES:
            self._step(f"Loading the example target {example}", call_command, "load_example",
                       example, stdout=self.stdout)
        if not options["no_showcase"]:
            # By name, not import: the core does not import the agents app above it.
            self._step("Starting the showcase runs on demo-kernels", call_command,
                       "start_runs", "demo-kernels", stdout=self.stdout, stderr=self.stderr)

    def _step(self, what: str, run: Any, *args: Any, **kwargs: Any) -> None:
        started = time.monotonic()
        self.stdout.write(f"{what}…")
        run(*args, **kwargs)
        self.stdout.write(f"{what}: done in {time.monotonic() - started:.1f} s")
