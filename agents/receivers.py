"""Reactions of the agents app to the core's signals."""

from __future__ import annotations

from typing import Any

from django.dispatch import receiver

from infraops.signals import experiment_finished


@receiver(experiment_finished)
def wake_waiting_runs(sender: Any, *, experiment_id: int, **kwargs: Any) -> None:
    from agents.services import run_wake

    run_wake(experiment_id=experiment_id)
