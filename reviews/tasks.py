"""Thin Celery tasks of the reviews app: take ids, call one service."""

from __future__ import annotations

from celery import shared_task

from infraops.dbretry import retried
from reviews.services import decide, merge


@shared_task(acks_late=True, reject_on_worker_lost=True)
def change_advance(change_id: int) -> None:
    """Take a change as far as it can go (merge it, or look at its re-verification). Safe
    twice: the advisory lock and the guarded transitions of reviews.services.merge, so a
    dropped database connection takes it again from git's and the row's state."""
    retried(lambda: merge.change_advance(change_id=change_id), what=f"change {change_id} merge")


@shared_task
def changes_reap() -> list[int]:
    """Finish merges a killed process left half done; move on re-verified changes."""
    return merge.changes_reap()



@shared_task
def requested_changes_deliver() -> list[int]:
    """Deliver the requests for changes a killed process left undelivered."""
    return decide.requested_changes_reap()
