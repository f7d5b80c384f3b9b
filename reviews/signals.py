"""Signals the reviews app sends so that apps above it (the skeleton library) can react
without this app importing them. Each is sent after the commit that made the fact true, so a
receiver never sees a change that a rollback then takes back."""

from __future__ import annotations

import logging

from django.db import transaction
from django.dispatch import Signal
from django.utils import timezone

from reviews.models import ReviewDecision

logger = logging.getLogger(__name__)

# kwargs: change_id. The change is recorded with its risk and gate; the run that submitted it
# holds it by then (agents submit inside one transaction).
change_submitted = Signal()

# kwargs: change_id, status ("merged" or "rejected"): the change's decision is final.
change_decided = Signal()


def change_submitted_after_commit(change_id: int) -> None:
    transaction.on_commit(lambda: change_submitted.send(sender=None, change_id=change_id))


def change_decided_after_commit(change_id: int, status: str) -> None:
    transaction.on_commit(
        lambda: change_decided.send(sender=None, change_id=change_id, status=status))


# kwargs: decision_id. A reviewer requested changes: the app that runs agents delivers the
# decision's comments (to the run that wrote the change while it runs, else to a run active
# on its goal, else to a follow-up run) and writes where they went on the decision's
# `delivery`, which the change page shows.
changes_requested = Signal()


def changes_requested_after_commit(decision_id: int) -> None:
    transaction.on_commit(lambda: changes_requested_send(decision_id))


def changes_requested_send(decision_id: int) -> None:
    """Claim the decision's delivery, send, and when no receiver answered or one failed, say
    so on the decision: the page never claims the comments went back to an agent when they
    did not. A delivery already claimed is left to its claimant (once, not twice)."""
    claim = {"outcome": "delivering", "since": timezone.now().isoformat()}
    if not ReviewDecision.objects.filter(pk=decision_id, delivery={}).update(delivery=claim):
        return
    answers = changes_requested.send_robust(sender=None, decision_id=decision_id)
    failed = [answer for _, answer in answers if isinstance(answer, Exception)]
    for error in failed:
        logger.error("delivering decision %s failed", decision_id,
                     exc_info=(type(error), error, error.__traceback__))
    if not answers or failed:
        reason = (f"delivering them failed ({type(failed[0]).__name__}: {failed[0]})" if failed
                  else "no agent app is installed to receive them")
        ReviewDecision.objects.filter(pk=decision_id, delivery=claim).update(
            delivery={"outcome": "undelivered", "reason": reason})
