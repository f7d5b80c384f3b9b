"""manage.py worker_revoke NAME: the worker's token is refused from now on."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from infraops.experiments.fleet import worker_revoke
from infraops.models import Worker


class Command(BaseCommand):
    help = "Revoke a worker: its token is refused from its next request on."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")

    def handle(self, *args: Any, **options: Any) -> None:
        worker = Worker.objects.filter(name=options["name"]).first()
        if worker is None:
            raise CommandError(f"there is no worker named {options['name']!r}.")
        if worker.revoked_at is not None:
            self.stdout.write(f"Worker {worker.name} was revoked already.")
            return
        worker_revoke(worker=worker, by=None)
        self.stdout.write(f"Worker {worker.name} is revoked: its token is refused from now on.")
