"""The run page's websocket: 'new events up to N' in, rendered rows out.

Session and role re-checks, frame limits and the fetch-over-HTTP frame come from
infraops.consumers.SequencedLogConsumer.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import OrderedDict
from typing import Any

from django.template.loader import render_to_string

from agents.events import run_group
from agents.models import AgentRun, RunEvent
from agents.views import RUN_READ, load_ledger
from infraops.access import scoped, target_roles
from infraops.consumers import BATCH, SequencedLogConsumer


class RunConsumer(SequencedLogConsumer):
    notified = 0  # the newest row number a notification announced
    roles: tuple[str, ...] | None = None  # the viewer's roles as last read with the run

    async def run_events(self, event: dict[str, Any]) -> None:
        with contextlib.suppress(TypeError, ValueError):
            self.notified = max(self.notified, int(event.get("upto", 0)))
        await self.notify_new(event)

    # What the live partial swaps besides the rows: re-read from the page fetched over HTTP.
    refresh_ids = ("run-status", "run-budget", "run-trials", "run-controls", "run-wait",
                   "run-ledger", "run-step-sync")

    async def connect(self) -> None:
        self.http_url = f"/runs/{int(self.scope['url_route']['kwargs']['pk'])}/"
        await super().connect()

    def group(self) -> str:
        return run_group(self.object_id)

    def may_view(self, user: Any) -> bool:
        return scoped(AgentRun.objects.filter(pk=self.object_id), user).exists()

    def last_seq(self) -> int:
        last = (RunEvent.objects.filter(run_id=self.object_id).order_by("-seq")
                .values_list("seq", flat=True).first())
        return int(last or 0)

    def render_after(self, after: int, limit: int = BATCH) -> tuple[str, int]:
        # Announced rows another watcher has rendered already (as of that number or later):
        # no database at all.
        if self.roles is not None and self.notified > after:
            latest: tuple[int, tuple[str, int]] | None = LATEST.get(
                (self.object_id, after, limit, self.roles))
            if latest is not None and latest[0] >= self.notified:
                return latest[1]
        run = RUN_READ.get(self.object_id)
        if run is None or run.event_seq <= after:
            return "", after  # every row up to event_seq is committed with it: none is new
        # The controls depend on who watches.
        self.roles = tuple(sorted(target_roles(self.scope["user"], run.target_id)))
        key = (run.pk, after, limit, run.event_seq, run.status, run.step_count,
               run.experiment_count, run.tokens_used, str(run.cost_usd), run.stop_reason,
               run.provider_failing_since, run.finished_at, self.roles)
        cached: tuple[str, int] | None = FRAMES.get(key)
        if cached is not None:
            return cached
        events = list(RunEvent.objects.filter(run_id=self.object_id, seq__gt=after)
                      .order_by("seq")[:limit])
        if not events:
            return "", after
        load_ledger(run)
        html = render_to_string("agents/run.html#live-update",
                                {"run": run, "events": events, "target_roles": set(self.roles)})
        frame = (html, events[-1].seq)
        FRAMES.put(key, frame)
        # For the watchers a notification wakes: the newest frame after `after`, with the
        # row number it was read at; one announced up to that number or before takes it.
        LATEST.put((run.pk, after, limit, self.roles), (run.event_seq, frame))
        return frame


class Frames:
    """The live partial each watcher of a run would render alike, rendered once per process:
    ten pages on one run asked for the same rows after the same number, each paying database
    reads and a render through the consumers' one database thread, and a line took 0.3 to 0.7 s
    to reach them (bench/stream.py). A frame is kept under everything it shows: the rows after
    `after` (fixed once event_seq says they exist: events are append-only), the run's counters,
    status and stop reason, and the viewer's roles; and, for the watchers a notification wakes,
    as the newest frame after `after` with the row number it was read at (every change of
    state is an event of its own, so the number says the state): a frame read at the announced
    number or later serves. Kept
    FRAME_SECONDS at most, so the wall time shown stays near now."""

    def __init__(self, kept: int = 256) -> None:
        self._frames: OrderedDict[tuple[Any, ...], tuple[float, Any]] = OrderedDict()
        self._kept = kept
        self._lock = threading.Lock()

    def get(self, key: tuple[Any, ...]) -> Any:
        with self._lock:
            found = self._frames.get(key)
            if found is None or time.monotonic() - found[0] > FRAME_SECONDS:
                return None
            return found[1]

    def put(self, key: tuple[Any, ...], frame: Any) -> None:
        with self._lock:
            self._frames[key] = (time.monotonic(), frame)
            while len(self._frames) > self._kept:
                self._frames.popitem(last=False)


FRAME_SECONDS = 5.0
FRAMES = Frames()  # (html, last row) under everything the frame shows
LATEST = Frames()  # (row number read at, (html, last row)) under the rows' start and roles
