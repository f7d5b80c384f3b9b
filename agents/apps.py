from __future__ import annotations

from typing import TYPE_CHECKING

from django.apps import AppConfig

if TYPE_CHECKING:
    from infraops.models import Target, Worker


def run_push_check(worker: Worker, target: Target | None, number: int) -> str | None:
    """A remote worker may push run N's branches only while run N is running on this target
    (infraops.experiments.fleet.worker_may_push asks; the core does not know runs)."""
    from agents.models import AgentRun

    run = AgentRun.objects.filter(pk=number).only("status", "target_id").first()
    if run is None:
        return f"there is no run {number}"
    if run.status != AgentRun.Status.RUNNING:
        return f"run {number} is {run.status}, not running"
    if target is None or run.target_id != target.pk:
        return f"run {number} is not a run of this target"
    return None


class AgentsConfig(AppConfig):
    name = "agents"

    def ready(self) -> None:
        from agents import receivers  # noqa: F401  (connects to the core's signals)
        from agents.panels import panels_register
        from infraops.experiments.fleet import PUSH_CHECKS

        panels_register()  # the run controls and links on the core's pages
        if run_push_check not in PUSH_CHECKS:  # ready() may run twice in tests
            PUSH_CHECKS.append(run_push_check)
