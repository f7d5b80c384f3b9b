"""Websockets that stream a sequenced log from the database.

The client says the last sequence number it has, on every connect, so a reconnect catches
up; a group message only says there is more. Rows always come from the database, so a
dropped notification costs latency, never a line: a socket that heard nothing for
REREAD_SECONDS reads its rows again.

Every socket (GuardedConsumer) also:
- re-checks its session and its user's roles every RECHECK_SECONDS and before each send, and
  closes (4401 signed out, 4403 no longer allowed) once the session is gone (logout, expiry,
  another sign-in on the browser, a password change) or the user lost every role or the
  right to the object;
- refuses client frames over MAX_CLIENT_FRAME bytes (close 1009) and ignores malformed or
  absurdly nested JSON, staying open;
- never sends a frame over MAX_SERVER_FRAME bytes: fewer rows per frame, and when even one
  row is too big, a `<template data-live-fetch>` frame that tells the page
  (static/js/live-log.js) to fetch the rows over HTTP and then say where it is again.

Backpressure (docs/reliability.md W4): a group message only wakes the socket's one sender
task and returns, so notifications never pile up behind a slow client (the pub/sub channel
layer's queue per channel has no bound). The sender reads rows from the database at the pace
the client takes them (the server's send waits while the client's TCP window is full), so
the server holds at most one frame per socket and the client's transcript stays complete.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from importlib import import_module
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
from django.contrib.auth.models import User
from django.template.loader import render_to_string
from django.utils.crypto import constant_time_compare
from django.utils.html import format_html
from uvicorn.protocols.utils import ClientDisconnected
from websockets.exceptions import ConnectionClosed

from infraops.access import has_any_access, scoped
from infraops.experiments.results import experiment_group
from infraops.live import CURSOR_MAX
from infraops.models import Experiment, ExperimentLog

log = logging.getLogger(__name__)

BATCH = 200
RECHECK_SECONDS = 2.0  # a revoked session or role closes the socket within this (plus a query)
SEND_RECHECK_SECONDS = 1.0  # a frame goes out at most this long after a passing check
MAX_CLIENT_FRAME = 64 * 1024  # bytes; the pages send {"after": n}
MAX_SERVER_FRAME = 256 * 1024  # bytes of one frame the server sends
# With no notification for this long, a socket whose client is ready reads its rows again: a
# notification can be lost (the channel layer drops what it cannot send, and one published
# before the socket's subscription took effect on Redis reaches nobody: channels_redis sends
# SUBSCRIBE without waiting for it), and a page must not wait for the next event to see the
# last rows of a run. One narrow read per idle socket per period.
REREAD_SECONDS = 5.0

CLOSE_SIGNED_OUT = 4401
CLOSE_FORBIDDEN = 4403
CLOSE_TOO_BIG = 1009  # RFC 6455: message too big
CLOSE_SERVER_ERROR = 1011  # RFC 6455: the server met a condition it could not handle


def _frame_bytes(text: str) -> int:
    return len(text.encode(errors="surrogatepass"))


def client_gone(exc: BaseException) -> bool:
    """The client closed or lost its socket while a frame was on its way: an expected end
    (a tab closed, a page left, a network that dropped), logged at INFO without a traceback.
    uvicorn raises ClientDisconnected (an OSError) and websockets ConnectionClosed; every
    such disconnect had been an ERROR with a traceback (issue 28)."""
    return isinstance(exc, (ClientDisconnected, ConnectionClosed, ConnectionError))


class GuardedConsumer(AsyncWebsocketConsumer):
    """A socket for one signed-in user with a role, for as long as that stays true."""

    user_id: int | None = None
    session_key: str | None = None
    _watch_task: asyncio.Task[None] | None = None
    _closing = False
    _allowed_at = float("-inf")  # when the last check let the socket stay

    def may_view(self, user: Any) -> bool:
        """The object-level check (the socket's object exists and the user sees its target:
        infraops.access.scoped)."""
        return True

    # --- the session and roles, at connect and then periodically ----------------------

    def _session_user(self) -> User | None:
        """The user whose session this socket rode in on, while that session still signs
        them in (the same check django.contrib.auth.get_user makes), else None."""
        if not self.session_key or self.user_id is None:
            return None
        store = import_module(settings.SESSION_ENGINE).SessionStore(session_key=self.session_key)
        data = store.load()  # {} once the session was flushed (logout) or expired
        if str(data.get(SESSION_KEY)) != str(self.user_id):
            return None
        if data.get(BACKEND_SESSION_KEY) not in settings.AUTHENTICATION_BACKENDS:
            return None
        user = User.objects.filter(pk=self.user_id, is_active=True).first()
        if user is None:
            return None
        session_hash = data.get(HASH_SESSION_KEY)
        if not session_hash or not constant_time_compare(str(session_hash),
                                                         user.get_session_auth_hash()):
            return None  # the password changed: Django signs the session out
        return user

    def _access(self) -> int | None:
        """None while the socket may stay open, else the close code."""
        user = self._session_user()
        if user is None:
            return CLOSE_SIGNED_OUT
        if not has_any_access(user) or not self.may_view(user):
            return CLOSE_FORBIDDEN
        return None

    async def guard_connect(self) -> bool:
        """Accept the socket if its user may have it; else close it. True when accepted."""
        user = self.scope.get("user")
        session = self.scope.get("session")
        if user is not None and user.is_authenticated and session is not None:
            self.user_id = user.pk
            self.session_key = session.session_key
        denied = await database_sync_to_async(self._access)()
        if denied is not None:
            await self.close(code=CLOSE_FORBIDDEN)
            return False
        self._allowed_at = time.monotonic()
        await self.accept()
        self._watch_task = asyncio.create_task(self._watch())
        return True

    async def _watch(self) -> None:
        while not self._closing:
            await asyncio.sleep(RECHECK_SECONDS)
            if await self.still_allowed():
                continue
            return

    async def still_allowed(self) -> bool:
        """Check now; close the socket when it may no longer stay open."""
        if self._closing:
            return False
        try:
            denied = await database_sync_to_async(self._access)()
        except Exception:  # a database hiccup: keep the socket, check again next time
            log.exception("websocket access re-check failed")
            return True
        if denied is None:
            self._allowed_at = time.monotonic()
            return True
        await self._close_once(denied)
        return False

    async def _close_once(self, code: int) -> None:
        if not self._closing:
            self._closing = True
            await self.close(code=code)

    async def guarded_send(self, text: str) -> bool:
        """Send a frame if the socket may still have it. False when it was closed instead.
        The check is the one of the last SEND_RECHECK_SECONDS when there was one: checked
        before every frame, ten watchers of a log at 50 lines/s spent as much of the web
        process on re-reading sessions and roles as on the rows (bench/stream.py)."""
        if self._closing:
            return False
        if time.monotonic() - self._allowed_at > SEND_RECHECK_SECONDS and \
                not await self.still_allowed():
            return False
        if _frame_bytes(text) > MAX_SERVER_FRAME:  # the callers keep under it; never send one
            log.error("refused to send a %d-byte websocket frame", _frame_bytes(text))
            return False
        await self.send(text_data=text)
        return True

    async def disconnect(self, code: int) -> None:
        self._closing = True
        task = self._watch_task
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    # --- client frames --------------------------------------------------------------------

    async def websocket_receive(self, message: dict[str, Any]) -> None:
        text, data = message.get("text"), message.get("bytes")
        size = _frame_bytes(text) if text is not None else len(data or b"")
        if size > MAX_CLIENT_FRAME:
            await self._close_once(CLOSE_TOO_BIG)
            return
        if self._closing:
            return
        await super().websocket_receive(message)


def parse_after(text_data: str | None) -> int | None:
    """The n of a client's {"after": n} (0 to CURSOR_MAX), or None for anything else:
    malformed JSON, absurd nesting, another shape, a number that is not an integer."""
    if not text_data:
        return None
    try:
        message = json.loads(text_data)
    except (ValueError, RecursionError):  # RecursionError: '[[[[…' deeper than the parser
        return None
    if not isinstance(message, dict):
        return None
    after = message.get("after")
    if not isinstance(after, int) or isinstance(after, bool):
        return None
    return min(max(after, 0), CURSOR_MAX)


def parse_state(text_data: str | None) -> str | None:
    """The "state" a page says it shows, next to its "after" (a short word), or None."""
    try:
        message = json.loads(text_data or "")
    except (ValueError, RecursionError):
        return None
    state = message.get("state") if isinstance(message, dict) else None
    return state if isinstance(state, str) and len(state) <= 40 else None


class SequencedLogConsumer(GuardedConsumer):
    """Subclasses name the group, check access and render the rows after a number."""

    object_id: int
    last_sent: int
    client_ready: bool  # the client sent {"after": n}: only then do notifications send rows
    requested: int | None  # the client's latest {"after": n}, taken up by the sender task
    _wake: asyncio.Event
    _sender: asyncio.Task[None] | None = None
    fetch_upto: int  # rows up to this number were handed to the page to fetch over HTTP
    http_url: str = ""  # where the page fetches rows that do not fit a frame
    refresh_ids: tuple[str, ...] = ()  # elements the page re-reads from that fetch
    refresh_due = False  # the object's state moved: have the page re-read refresh_ids

    def group(self) -> str:
        raise NotImplementedError

    def render_after(self, after: int, limit: int = BATCH) -> tuple[str, int]:
        """HTML for up to `limit` rows after `after`, and the last number rendered."""
        raise NotImplementedError

    def last_seq(self) -> int:
        """The number of the newest row now."""
        raise NotImplementedError

    async def connect(self) -> None:
        self.object_id = int(self.scope["url_route"]["kwargs"]["pk"])
        self.last_sent = 0
        self.client_ready = False
        self.fetch_upto = 0
        self.requested = None
        self._wake = asyncio.Event()
        if await self.guard_connect():
            await self.channel_layer.group_add(self.group(), self.channel_name)
            self._sender = asyncio.create_task(self._send_loop())

    async def disconnect(self, code: int) -> None:
        await super().disconnect(code)
        task = self._sender
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if hasattr(self, "object_id"):
            await self.channel_layer.group_discard(self.group(), self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        after = parse_after(text_data)
        if after is None:
            return  # a malformed message asks for nothing
        shown = parse_state(text_data)
        if shown is not None and shown != await database_sync_to_async(self.current_state)():
            # The page shows a state the object has left (it moved while the page loaded or
            # the socket was down, and that notice is gone): have it re-read.
            self.refresh_due = True
        self.requested = after
        self._wake.set()

    def current_state(self) -> str | None:
        """The object's state as its page shows it (None: nothing to compare)."""
        return None

    async def notify_new(self, event: dict[str, Any]) -> None:
        """Wake the sender when there is more than the client has; never wait on the socket
        here, or a slow client makes every later notification queue on the server."""
        # Not before the client said where it is: sending from 0 and then from its own number
        # would give it every row in between twice (seen on a run page that connected while
        # events arrived).
        try:
            upto = int(event.get("upto", 0))
        except (TypeError, ValueError):
            upto = CURSOR_MAX
        if self.client_ready and upto > self.last_sent:
            self._wake.set()

    async def _send_loop(self) -> None:
        """The socket's only writer of rows: any number of wake-ups while it sends become
        one more pass over the database."""
        while not self._closing:
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=REREAD_SECONDS)
            except TimeoutError:
                if not self.client_ready:
                    continue  # the client has not said where it is: nothing to catch up
            self._wake.clear()
            if self.requested is not None:
                # Rows the page was told to fetch over HTTP are not offered again, even when
                # the fetch did not bring them (the page has its HTTP answer): no fetch loop.
                self.last_sent = max(self.requested, self.fetch_upto)
                self.requested = None
                self.client_ready = True
            try:
                await self._send_new()
                if self.refresh_due and self.client_ready:
                    self.refresh_due = False
                    await self._send_fetch()
            except Exception as exc:  # a database or socket fault: the page reconnects
                if self._closing:
                    return
                if client_gone(exc):
                    log.info("websocket client went away while a frame was sent (%s)",
                             type(exc).__name__)
                    self._closing = True
                    return
                log.exception("websocket sender failed; closing the socket")
                await self._close_once(CLOSE_SERVER_ERROR)
                return

    async def _send_new(self) -> None:
        limit = BATCH
        while self.client_ready and not self._closing:
            html, last = await database_sync_to_async(self.render_after)(self.last_sent, limit)
            if not html:
                return
            if _frame_bytes(html) > MAX_SERVER_FRAME:
                rendered = max(last - self.last_sent, 1)  # rows are numbered 1, 2, 3...
                if min(limit, rendered) > 1:
                    limit = max(min(limit, rendered) // 2, 1)  # fewer rows per frame
                    continue
                await self._send_fetch()  # one row alone does not fit: over HTTP
                return
            if not await self.guarded_send(html):
                return
            self.last_sent = last
            limit = BATCH

    async def _send_fetch(self) -> None:
        """Tell the page to fetch the rows after last_sent over HTTP; stream nothing more
        until it says where it is again."""
        upto = await database_sync_to_async(self.last_seq)()
        frame = format_html(
            '<template data-live-fetch data-after="{}" data-upto="{}" data-url="{}" '
            'data-refresh="{}"></template>',
            self.last_sent, upto, self.http_url, " ".join(self.refresh_ids))
        if await self.guarded_send(str(frame)):
            self.fetch_upto = max(self.fetch_upto, upto)
            self.client_ready = False


class ExperimentLogConsumer(SequencedLogConsumer):
    """The experiment page's socket: its probe output as rows, and, when the experiment's state
    moves (claimed, finished, failed), a frame that has the page re-read its status, feedback,
    charts and tables over HTTP: the page is live to its end without a reload."""

    log_lines = SequencedLogConsumer.notify_new
    refresh_ids = ("experiment-status", "experiment-alerts", "experiment-feedback",
                   "experiment-comparison", "experiment-executions")

    async def experiment_changed(self, event: dict[str, Any]) -> None:
        self.refresh_due = True
        self._wake.set()

    def current_state(self) -> str | None:
        return Experiment.objects.filter(pk=self.object_id).values_list(
            "status", flat=True).first()

    async def connect(self) -> None:
        self.http_url = f"/experiments/{int(self.scope['url_route']['kwargs']['pk'])}/"
        await super().connect()

    def group(self) -> str:
        return experiment_group(self.object_id)

    def may_view(self, user: Any) -> bool:
        return scoped(Experiment.objects.filter(pk=self.object_id), user).exists()

    def last_seq(self) -> int:
        last = (ExperimentLog.objects.filter(experiment_id=self.object_id)
                .order_by("-seq").values_list("seq", flat=True).first())
        return int(last or 0)

    def render_after(self, after: int, limit: int = BATCH) -> tuple[str, int]:
        rows = list(ExperimentLog.objects.filter(experiment_id=self.object_id, seq__gt=after)
                    .order_by("seq")[:limit])
        if not rows:
            return "", after
        experiment = Experiment.objects.get(pk=self.object_id)
        html = render_to_string("infraops/experiment.html#log-update",
                                {"experiment": experiment, "logs": rows})
        return html, rows[-1].seq
