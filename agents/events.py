"""Appending to a run's event log: a row first, a notification after commit."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import connection, transaction

from agents.models import AgentRun, RunEvent
from infraops.live import notify

RUNS_GROUP = "runs"  # a run started: the dashboards follow its group too


def run_group(run_id: int) -> str:
    return f"run-{run_id}"


def run_event(*, run_id: int, kind: str, message: str, data: dict[str, Any] | None = None
              ) -> RunEvent:
    """Append one event with the run's next sequence number, then tell the run's group."""
    [(pk, seq, created)] = _append(run_id, [(kind, message, data)])
    return RunEvent(pk=pk, run_id=run_id, seq=seq, kind=kind, message=message, data=data or {},
                    created_at=created)


def run_events_append(*, run_id: int,
                      entries: Sequence[tuple[str, str, dict[str, Any] | None]]) -> int:
    """Append (kind, message, data) events with the run's next sequence numbers in one
    transaction and one notification: how a burst of lines reaches the log at thousands a
    second (bench/live_log.py). The last sequence number (0 for no entries)."""
    made = _append(run_id, entries)
    return max((seq for _, seq, _ in made), default=0)


def _append(run_id: int, entries: Sequence[tuple[str, str, dict[str, Any] | None]]
            ) -> list[tuple[int, int, datetime]]:
    """(pk, seq, created_at) of the appended rows. One statement: the run's counter moves by
    the batch's size (the update holds the run's row lock until commit, so numbers never
    collide) and the rows go in numbered from it, built by the database from three arrays
    instead of one model instance each."""
    if not entries:
        return []
    params: dict[str, Any] = {
        "run": run_id, "n": len(entries), "kinds": [kind for kind, _, _ in entries],
        "messages": [message for _, message, _ in entries],
        "datas": [json.dumps(data or {}) for _, _, data in entries]}
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(_APPEND, params)
        made: list[tuple[int, int, datetime]] = cursor.fetchall()
        if not made:
            raise AgentRun.DoesNotExist(f"run {run_id} does not exist")
        notify(run_group(run_id), {"type": "run.events", "upto": max(seq for _, seq, _ in made)})
    return made


# The models' tables by name (agents_agentrun, agents_runevent): every event goes through
# here, so a renamed table fails every test at once.
_APPEND = """
WITH bumped AS (
    UPDATE agents_agentrun SET event_seq = event_seq + %(n)s
    WHERE id = %(run)s RETURNING event_seq
)
INSERT INTO agents_runevent (run_id, seq, kind, message, data, created_at)
SELECT %(run)s, bumped.event_seq - %(n)s + rows.ord, rows.kind, rows.message,
       rows.data::jsonb, statement_timestamp()
FROM bumped, unnest(%(kinds)s::text[], %(messages)s::text[], %(datas)s::text[])
     WITH ORDINALITY AS rows(kind, message, data, ord)
RETURNING id, seq, created_at
"""
