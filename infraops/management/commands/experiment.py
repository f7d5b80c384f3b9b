"""manage.py experiment TARGET --candidate REV [--base REV] [--probe NAME ...] [--here]:
compare any two revisions of a target without a Django shell. The experiment is queued for
the workers, as the target page's would be; with --here it runs in this process instead (a
machine with no worker running), and its feedback is printed."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.urls import reverse

from infraops.errors import DomainError
from infraops.experiments.services import experiment_compare, experiment_execute
from infraops.models import Target


class Command(BaseCommand):
    help = "Compare two revisions of a target: an experiment of --candidate against --base."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("target", help="The target's name.")
        parser.add_argument("--candidate", required=True,
                            help="The revision to measure: a branch, tag or commit sha.")
        parser.add_argument("--base", default="",
                            help="The revision to measure it against (default: the target's "
                                 "base branch).")
        parser.add_argument("--probe", action="append", default=[], dest="probes",
                            help="A probe to run (repeatable; default: those covering the "
                                 "changed paths).")
        parser.add_argument("--here", action="store_true",
                            help="Run it in this process and print its feedback, instead of "
                                 "queueing it for a worker.")

    def handle(self, *args: Any, **options: Any) -> None:
        target = Target.objects.filter(name=options["target"]).first()
        if target is None:
            known = ", ".join(Target.objects.order_by("name").values_list("name", flat=True))
            raise CommandError(f"No target named {options['target']!r}; targets: "
                               f"{known or 'none yet'}.")
        try:
            experiment = experiment_compare(target=target, candidate=options["candidate"],
                                            base=options["base"], probes=options["probes"],
                                            send=not options["here"])
        except DomainError as exc:
            raise CommandError(str(exc)) from None
        where = reverse("infraops:experiment", args=[experiment.pk])
        self.stdout.write(f"Experiment {experiment.pk}: {experiment.candidate_commit[:10]} "
                          f"against {experiment.baseline_commit[:10]}, probes "
                          f"{', '.join(experiment.probes)} ({where})")
        if not options["here"]:
            self.stdout.write(f"Queued on {experiment.queue}; a worker runs it.")
            return
        done = experiment_execute(experiment_id=experiment.pk, worker="manage.py:experiment")
        if done is None:
            raise CommandError(f"Experiment {experiment.pk} was claimed elsewhere.")
        self.stdout.write(f"{done.status}: {done.failure_reason}".rstrip(": "))
        self.stdout.write(str((done.feedback or {}).get("agent_text", "")))

