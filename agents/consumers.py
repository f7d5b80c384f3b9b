"""The run page's websocket: 'new events up to N' in, rendered rows out; and the dashboard's.

Session and role re-checks, frame limits and the fetch-over-HTTP frame come from
infraops.consumers.SequencedLogConsumer.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import OrderedDict
from typing import Any

from channels.db import database_sync_to_async
from django.template.loader import render_to_string

from agents.events import RUNS_GROUP, run_group
from agents.models import AgentRun, RunEvent
from agents.views import RUN_READ, dashboard_live, load_ledger
from infraops.access import scoped, target_roles, visible_target_ids
from infraops.consumers import BATCH, GuardedConsumer, SequencedLogConsumer
from reviews.live import REVIEWS_GROUP


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


DASHBOARD_SECONDS = 1.0  # a dashboard re-renders at most this often while runs move


class DashboardConsumer(GuardedConsumer):
    """The dashboard's socket: its goals and recent runs, re-rendered for this user (the
    targets they see, read afresh) when a run it shows moves, a run starts, or a change's
    status moves; at most every DASHBOARD_SECONDS, however fast the runs log.

    It follows the active runs' own groups (their event notices) and the "runs" group (a run
    started: follow it too) and the review group (a merge moves a goal's progress), so no
    writer sends anything for dashboards alone."""

    _following: set[str]
    _pending: asyncio.Task[None] | None = None

    async def connect(self) -> None:
        self._following = set()
        if not await self.guard_connect():
            return
        await self._follow([RUNS_GROUP, REVIEWS_GROUP])
        await self.runs_started({})  # the page may be older than the socket: catch up now

    async def disconnect(self, code: int) -> None:
        await super().disconnect(code)
        if self._pending is not None:
            self._pending.cancel()
        for group in self._following:
            await self.channel_layer.group_discard(group, self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        """The client has nothing to say on this socket."""

    async def _follow(self, groups: list[str]) -> None:
        for group in groups:
            if group not in self._following:
                self._following.add(group)
                await self.channel_layer.group_add(group, self.channel_name)

    async def runs_started(self, event: dict[str, Any]) -> None:
        await self._follow(await database_sync_to_async(self._active_run_groups)())
        self._soon()

    async def run_events(self, event: dict[str, Any]) -> None:
        self._soon()

    async def reviews_changed(self, event: dict[str, Any]) -> None:
        self._soon()

    def _soon(self) -> None:
        if self._pending is None or self._pending.done():
            self._pending = asyncio.create_task(self._send_later())

    async def _send_later(self) -> None:
        await asyncio.sleep(DASHBOARD_SECONDS)
        html = await database_sync_to_async(self.render)()
        if html:
            await self.guarded_send(html)

    def _active_run_groups(self) -> list[str]:
        user = self._session_user()
        if user is None:
            return []
        runs = scoped(AgentRun.objects.filter(status__in=AgentRun.active_statuses()), user)
        return [run_group(pk) for pk in runs.values_list("pk", flat=True)]

    def render(self) -> str:
        user = self._session_user()
        if user is None:
            return ""  # signed out meanwhile: the re-check closes the socket
        return render_to_string("agents/dashboard.html#dashboard-live",
                                dashboard_live(visible_target_ids(user)))
