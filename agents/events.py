"""Appending to a run's event log: a row first, a notification after commit."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from django.db import connection, transaction

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
    second (bench/live_log.py).

    One statement: the run's counter moves by the batch's size (the update holds the run's
    row lock until commit, so numbers never collide) and the rows go in numbered from it,
    built by the database from three arrays instead of one model instance each."""
    if not entries:
        return []
    kinds = [kind for kind, _, _ in entries]
    messages = [message for _, message, _ in entries]
    datas = [json.dumps(data or {}) for _, _, data in entries]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(_APPEND, {"run": run_id, "n": len(entries), "kinds": kinds,
                                 "messages": messages, "datas": datas})
        made = sorted(cursor.fetchall(), key=lambda row: row[1])
        if not made:
            raise AgentRun.DoesNotExist(f"run {run_id} does not exist")
        first = made[0][1]
        notify(run_group(run_id), {"type": "run.events", "upto": made[-1][1]})
    return [RunEvent(pk=pk, run_id=run_id, seq=seq, kind=kinds[seq - first],
                     message=messages[seq - first], data=entries[seq - first][2] or {},
                     created_at=created)
            for pk, seq, created in made]


_APPEND = f"""
WITH bumped AS (
    UPDATE {AgentRun._meta.db_table} SET event_seq = event_seq + %(n)s
    WHERE id = %(run)s RETURNING event_seq
)
INSERT INTO {RunEvent._meta.db_table} (run_id, seq, kind, message, data, created_at)
SELECT %(run)s, bumped.event_seq - %(n)s + rows.ord, rows.kind, rows.message,
       rows.data::jsonb, statement_timestamp()
FROM bumped, unnest(%(kinds)s::text[], %(messages)s::text[], %(datas)s::text[])
     WITH ORDINALITY AS rows(kind, message, data, ord)
RETURNING id, seq, created_at
"""  # noqa: S608  (table names from the models; every value is a parameter)
