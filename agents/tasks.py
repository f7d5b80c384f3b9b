"""Thin Celery tasks of the agent: one step per task."""

from __future__ import annotations

from celery import shared_task

from agents import services


@shared_task(acks_late=True, reject_on_worker_lost=True)
def agent_step(run_id: int, number: int) -> None:
    """Take step `number` of run `run_id`. Safe twice: a taken step number is skipped."""
    services.run_step(run_id=run_id, number=number)
