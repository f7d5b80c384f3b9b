"""Appending to a run's event log: a row first, a notification after commit."""

from __future__ import annotations

from collections.abc import Sequence
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
    return run_events_append(run_id=run_id, entries=[(kind, message, data)])[0]


def run_events_append(*, run_id: int,
                      entries: Sequence[tuple[str, str, dict[str, Any] | None]]
                      ) -> list[RunEvent]:
    """Append (kind, message, data) events with the run's next sequence numbers in one
    transaction and one notification: how a burst of lines reaches the log at thousands a
    second (bench/live_log.py)."""
    with transaction.atomic():
        # The update takes the run's row lock until commit, so numbers never collide.
        AgentRun.objects.filter(pk=run_id).update(event_seq=F("event_seq") + len(entries))
        last = AgentRun.objects.filter(pk=run_id).values_list("event_seq", flat=True).get()
        first = last - len(entries) + 1
        events = RunEvent.objects.bulk_create(
            RunEvent(run_id=run_id, seq=first + i, kind=kind, message=message, data=data or {})
            for i, (kind, message, data) in enumerate(entries))
        notify(run_group(run_id), {"type": "run.events", "upto": last})
    return events
