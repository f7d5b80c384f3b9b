"""Appending to a run's event log: a row first, a notification after commit."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import F

from agents.models import AgentRun, RunEvent
from infraops.live import notify


def run_group(run_id: int) -> str:
    return f"run-{run_id}"


def run_event(*, run_id: int, kind: str, message: str, data: dict[str, Any] | None = None
              ) -> RunEvent:
    """Append one event with the run's next sequence number, then tell the run's group."""
    with transaction.atomic():
        # The update takes the run's row lock until commit, so numbers never collide.
        AgentRun.objects.filter(pk=run_id).update(event_seq=F("event_seq") + 1)
        seq = AgentRun.objects.filter(pk=run_id).values_list("event_seq", flat=True).get()
        event = RunEvent.objects.create(run_id=run_id, seq=seq, kind=kind, message=message,
                                        data=data or {})
        notify(run_group(run_id), {"type": "run.events", "upto": seq})
    return event
