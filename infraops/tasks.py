"""Thin Celery tasks of the core: take ids, call one service."""

from __future__ import annotations

from celery import shared_task
from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings

from infraops.experiments import services as experiments


@shared_task(acks_late=True, reject_on_worker_lost=True)
def experiment_execute(experiment_id: int) -> None:
    """Run one experiment. Safe twice: the claim and the per-attempt uniqueness guard it."""
    try:
        experiments.experiment_execute(experiment_id=experiment_id)
    except SoftTimeLimitExceeded:
        # Retrying would only hit the limit again: fail it now, with the reason.
        experiments.experiment_give_up(
            experiment_id=experiment_id, worker=experiments.worker_name(),
            reason=f"ran past the task time limit of {settings.CELERY_TASK_SOFT_TIME_LIMIT} s "
                   "(INFRAOPS_TASK_TIME_LIMIT): shorten the probes or raise the limit",
        )


@shared_task
def experiments_reap() -> list[int]:
    return experiments.experiments_reap()
