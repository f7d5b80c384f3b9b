"""Thin Celery tasks of the core: take ids, call one service."""

from __future__ import annotations

from celery import shared_task

from infraops.services import experiments


@shared_task(acks_late=True, reject_on_worker_lost=True)
def experiment_execute(experiment_id: int) -> None:
    """Run one experiment. Safe twice: the claim and the per-attempt uniqueness guard it."""
    experiments.experiment_execute(experiment_id=experiment_id)


@shared_task
def experiments_reap() -> list[int]:
    return experiments.experiments_reap()
