"""manage.py worker_register NAME --queues experiments,experiments.gpu

Registers a worker on another host and prints its token once on stdout (nothing else goes to
stdout, so a script may read it): set it there as INFRAOPS_WORKER_TOKEN."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from infraops.errors import DomainError
from infraops.experiments.fleet import queues_parse, worker_register


class Command(BaseCommand):
    help = "Register a worker on another host; its token is printed once."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="A slug naming the worker, such as gpu-h200-1.")
        parser.add_argument("--queues", default="experiments",
                            help="Comma-separated queues it consumes (default: experiments).")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            worker, token = worker_register(name=options["name"],
                                            queues=queues_parse(options["queues"]), by=None)
        except DomainError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(token)
        self.stderr.write(f"Worker {worker.name} registered for {', '.join(worker.queues)}. "
                          "The token above is shown once: set it as INFRAOPS_WORKER_TOKEN on "
                          "the worker's host.")
