"""Thin Celery tasks of the skeleton library: take ids, call one service."""

from __future__ import annotations

from celery import shared_task

from skeletons import outcomes


@shared_task(acks_late=True, reject_on_worker_lost=True)
def skeleton_outcome(change_id: int) -> None:
    """What a merged or rejected change means for the skeleton library. Safe twice: uses move
    only out of "applied", and a change proposes at most one draft."""
    outcomes.skeleton_outcome_record(change_id=change_id)
