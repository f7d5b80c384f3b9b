from __future__ import annotations

from django.apps import AppConfig


class AgentsConfig(AppConfig):
    name = "agents"

    def ready(self) -> None:
        from agents import receivers  # noqa: F401  (connects to the core's signals)
