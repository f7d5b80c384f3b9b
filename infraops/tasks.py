"""Thin Celery tasks of the core: take ids, call one service."""

from __future__ import annotations

from celery import shared_task
from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings

from infraops.experiments import services as experiments
from infraops.services import targets

# The deadline of a target's git work (checking the URL, cloning, fetching): a repository
# larger or slower than this is refused with the reason, and the worker is free again.
TARGET_FETCH_SECONDS = 300


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


@shared_task(acks_late=True, reject_on_worker_lost=True, soft_time_limit=TARGET_FETCH_SECONDS,
             time_limit=TARGET_FETCH_SECONDS + 30)
def target_fetch(target_id: int, check: bool, reclone: bool) -> None:
    """Fetch a target's repository for a form (targets.target_fetch_request). Safe twice."""
    try:
        targets.target_fetch(target_id=target_id, check=check, reclone=reclone)
    except SoftTimeLimitExceeded:
        targets.target_fetch_failed(target_id=target_id, reason=(
            f"fetching the repository took longer than {TARGET_FETCH_SECONDS} s and was "
            "stopped: check the URL, or fetch a smaller repository"))
