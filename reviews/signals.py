"""Signals the reviews app sends so that apps above it (the skeleton library) can react
without this app importing them. Each is sent after the commit that made the fact true, so a
receiver never sees a change that a rollback then takes back."""

from __future__ import annotations

from django.db import transaction
from django.dispatch import Signal

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
