"""Thin Celery tasks of the agent: one step per task."""

from __future__ import annotations

import logging

from celery import shared_task

from agents import services

log = logging.getLogger(__name__)


@shared_task(acks_late=True, reject_on_worker_lost=True)
def agent_step(run_id: int, number: int) -> None:
    """Take step `number` of run `run_id`. Safe twice: a taken step number is skipped."""
    try:
        services.run_step(run_id=run_id, number=number)
    except Exception as exc:
        # A bug or an outage must not leave the run 'running' with nothing queued: it pauses
        # with the reason, and an engineer resumes it once the cause is fixed.
        log.exception("step %s of run %s failed", number, run_id)
        services.run_pause_for_error(run_id=run_id, error=exc)


@shared_task
def runs_reap() -> list[int]:
    return services.runs_reap()
