"""manage.py demo_llm [--port N]: serve the demo's scripted model (agents/scripted/demo.py) as
an OpenAI-compatible endpoint on 127.0.0.1 until stopped. `standalone --demo-llm` starts it and
points the web and the workers at it (OPENAI_BASE_URL, INFRAOPS_MODEL)."""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from agents.scripted.demo import MODEL, DemoModel
from agents.scripted.endpoint import OpenAIStub


class Command(BaseCommand):
    help = "Serve the demo's scripted model as an OpenAI-compatible endpoint."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--port", type=int, default=0, help="0: any free port.")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            endpoint = OpenAIStub(port=options["port"], fallback=DemoModel())
        except OSError as exc:
            raise CommandError(f"Cannot listen on port {options['port']}: {exc}") from None
        stopped = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stopped.set())
        with endpoint:
            self.stdout.write(f"The demo model {MODEL!r} answers at {endpoint.base_url}",
                              ending="\n")
            self.stdout.flush()
            with contextlib.suppress(KeyboardInterrupt):
                stopped.wait()
