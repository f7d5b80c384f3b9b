"""Reactions of the agents app to the core's signals."""

from __future__ import annotations

from typing import Any

from django.dispatch import receiver

from infraops.signals import experiment_finished
from reviews.signals import changes_requested


@receiver(experiment_finished)
def wake_waiting_runs(sender: Any, *, experiment_id: int, **kwargs: Any) -> None:
    from agents.services import run_wake

    run_wake(experiment_id=experiment_id)


@receiver(changes_requested)
def deliver_requested_changes(sender: Any, *, decision_id: int, **kwargs: Any) -> None:
    from agents.services import changes_requested_deliver

    changes_requested_deliver(decision_id=decision_id)
