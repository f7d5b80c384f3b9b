from __future__ import annotations

from django.apps import AppConfig


class AgentsConfig(AppConfig):
    name = "agents"

    def ready(self) -> None:
        from agents import receivers  # noqa: F401  (connects to the core's signals)
        from agents.panels import panels_register

        panels_register()  # the run controls and links on the core's pages
