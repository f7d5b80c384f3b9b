"""manage.py prepare [--no-example] [--no-showcase | --showcase-only TARGET ...]: what
`standalone` does before it starts its processes, in one process: migrate, collect the static
files (only when they changed since the last collection), create the first users on the first
start, load the example targets (tiny-serving, and demo-kernels with a goal per case of
docs/product.md; where a GPU worker will run and flash-linear-attention's pinned release is
installed, fla-kda and fla-cp) and the showcase: a run on each goal of demo-kernels and of the
FLA targets that were loaded and that can run here (`start_runs`), queued for the workers that
standalone starts next. The first start says each step and each goal left out; a later one
says only what it newly did.

One process instead of one per step: Django's start-up is paid once (a warm start of the
standalone spent most of its time starting Python for each step). The first users are made
when no superuser exists, asked of the database here rather than read from another process's
printed output.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.staticfiles import finders
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

from infraops.example_sources import ExampleSourceError, source_problem, source_read
from infraops.management.commands import load_example
from infraops.models import Goal

EXAMPLES = ("tiny-serving", "demo-kernels")
# Built from flash-linear-attention's pinned release (examples/<name>/source.toml); their
# probes need a GPU, so they are loaded only where a GPU worker will run.
GPU_EXAMPLES = ("fla-kda", "fla-cp")
SHOWCASE = ("demo-kernels", *GPU_EXAMPLES)
# In the collected folder: the static files collected there last (static_sources()).
STATIC_STAMP = ".infraops-collected"


class Command(BaseCommand):
    help = "Migrate, collect static files, create the first users once, load the example."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--no-example", action="store_true")
        showcase = parser.add_mutually_exclusive_group()
        showcase.add_argument("--no-showcase", action="store_true",
                              help="Load the demo, but start no run on it.")
        showcase.add_argument(
            "--showcase-only", action="append", default=[], choices=SHOWCASE, metavar="TARGET",
            help=f"Start the showcase on this target only (repeatable; one of "
                 f"{', '.join(SHOWCASE)}): a bench driver keeps the one GPU for the FLA "
                 "targets, which the demo's own GPU goal would compete for.")

    def handle(self, *args: Any, **options: Any) -> None:
        self._step("Migrating the database", call_command, "migrate", interactive=False,
                   verbosity=0)
        self._collect_static()
        # The first start says everything; a later one says only what is new (a run started,
        # a goal added), not again each line of the first.
        first = not get_user_model().objects.filter(is_superuser=True).exists()
        if first:
            self.stdout.write("First start: creating the users (passwords are shown only now).")
            call_command("adduser", "admin", role=["engineer"], admin=True, stdout=self.stdout)
            call_command("adduser", "reviewer", role=["reviewer"], stdout=self.stdout)
        if options["no_example"]:
            return
        loaded = [*EXAMPLES, *self._gpu_examples(say_why_not=first)]
        for example in loaded:
            self._say_or_quiet(first, f"Loading the example target {example}", "load_example",
                               example)
        if options["no_showcase"]:
            return
        for target in options["showcase_only"] or SHOWCASE:
            if target not in loaded:
                continue  # a line said why when it was not loaded
            if not Goal.objects.filter(target__name=target).exists():
                if first:
                    self.stdout.write(f"No showcase on {target}: it has no goals "
                                      f"(examples/{target}.goals.toml).")
                continue
            # By name, not import: the core does not import the agents app above it.
            self._say_or_quiet(first, f"Starting the showcase runs on {target}", "start_runs",
                               target)

    def _say_or_quiet(self, first: bool, what: str, command: str, *args: str) -> None:
        """The command as a step with its lines on the first start; later at verbosity 0,
        where it says only what it newly did (a target or goal added, a run started)."""
        if first:
            self._step(what, call_command, command, *args, stdout=self.stdout,
                       stderr=self.stderr)
        else:
            call_command(command, *args, stdout=self.stdout, stderr=self.stderr, verbosity=0)

    def _collect_static(self) -> None:
        """collectstatic, unless the static files are those it collected last time: hashing
        and compressing them again was a third of a warm start's preparation. The collected
        copy of each file that changed since then is removed first: collectstatic keeps a
        copy at least as new as its source to the second, so an edit within the second of the
        last collection would otherwise never be collected."""
        root = Path(settings.STATIC_ROOT)
        stamp = root / STATIC_STAMP
        sources = static_sources()
        last = _read_stamp(stamp)
        if last == sources:
            return
        if last is not None:
            for path, entry in sources["files"].items():
                if last["files"].get(path) != entry:
                    (root / path).unlink(missing_ok=True)
        self._step("Collecting static files", call_command, "collectstatic", interactive=False,
                   verbosity=0)
        stamp.write_text(json.dumps(sources))

    def _gpu_examples(self, *, say_why_not: bool) -> tuple[str, ...]:
        """GPU_EXAMPLES where they can run; otherwise none, and one line says why not."""
        why_not = _why_not_gpu_examples()
        if why_not is None:
            return GPU_EXAMPLES
        if say_why_not:
            self.stdout.write(f"Not loading {' and '.join(GPU_EXAMPLES)}: {why_not}.")
        return ()

    def _step(self, what: str, run: Any, *args: Any, **kwargs: Any) -> None:
        started = time.monotonic()
        self.stdout.write(f"{what}…")
        run(*args, **kwargs)
        self.stdout.write(f"{what}: done in {time.monotonic() - started:.1f} s")


def static_sources() -> dict[str, Any]:
    """What collectstatic would collect: the storage that names the files and, for every
    file found, its path where it is collected with its size and modification time. A
    changed, added or removed file, or a Django upgrade's admin files, changes it."""
    files: dict[str, list[int]] = {}
    for finder in finders.get_finders():
        for path, storage in finder.list([]):
            collected = str(Path(getattr(storage, "prefix", None) or "", path))
            if collected in files:
                continue  # collectstatic, too, keeps the first finder's file of a path
            found = Path(storage.path(path)).stat()
            files[collected] = [found.st_size, found.st_mtime_ns]
    return {"storage": settings.STORAGES["staticfiles"]["BACKEND"], "files": files}


def _read_stamp(stamp: Path) -> dict[str, Any] | None:
    """The sources of the last collection, or None where none is on record (or the record is
    of another form: an earlier release wrote a bare hash)."""
    try:
        last = json.loads(stamp.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(last, dict) or not isinstance(last.get("files"), dict):
        return None
    return last


def _why_not_gpu_examples() -> str | None:
    """Why the FLA examples are not loaded here: no GPU worker would run their probes, or the
    release they are built from is not installed as pinned; None when they can be."""
    if not settings.GPU_WORKER:
        return ("no GPU worker here to run their probes (standalone starts one on a host with a "
                "GPU: --gpu auto or on)")
    for name in GPU_EXAMPLES:
        try:
            source = source_read(load_example.EXAMPLES / name)
        except ExampleSourceError as exc:
            raise CommandError(f"Example {name}: {exc}") from None
        problem = source_problem(source) if source is not None else None
        if problem is not None:
            return problem
    return None
