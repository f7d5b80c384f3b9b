"""Live notifications: sent through the channel layer after the commit that made them true.

The channel layer may drop a message; pages never depend on it alone (they catch up from
the database by sequence number).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import threading
from typing import Any

from channels.layers import BaseChannelLayer, get_channel_layer
from django.db import transaction

log = logging.getLogger(__name__)

CURSOR_MAX = 2**31 - 1  # a PositiveIntegerField's top: any larger 'after' means 'after all'
SEND_SECONDS = 5.0  # a notification not sent by then is dropped (logged), the caller goes on


def cursor(text: str | None) -> int:
    """A sequence number from an address (?after=N); anything else (abc, -1, 1e9, '²') is 0."""
    if not text or not (text.isascii() and text.isdigit()):
        return 0
    return CURSOR_MAX if len(text) > 10 else min(int(text), CURSOR_MAX)


class _Sender:
    """An event loop of this process's own, on a daemon thread, that sends notifications.

    The Redis channel layer keeps one connection per event loop. `async_to_sync` makes a new
    loop a call, so each notification connected to Redis afresh: 3.4 ms a notification, two or
    more an experiment, each on the worker's path between claim and finish. On one loop kept
    for the process the connection is reused. A process forked from this one (Celery's pool)
    forgets it at the fork (`reset`, below) and makes its own: the thread does not survive."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget the loop (and a lock another thread may have held at a fork)."""
        self.lock = threading.Lock()
        self.loop: asyncio.AbstractEventLoop | None = None

    def _loop(self) -> asyncio.AbstractEventLoop:
        with self.lock:
            if self.loop is None:
                self.loop = asyncio.new_event_loop()
                threading.Thread(target=self.loop.run_forever, name="live-notify",
                                 daemon=True).start()
            return self.loop

    def send(self, layer: BaseChannelLayer | None, group: str, message: dict[str, Any]) -> None:
        if layer is None:
            return
        future = asyncio.run_coroutine_threadsafe(layer.group_send(group, message),
                                                  self._loop())
        try:
            future.result(timeout=SEND_SECONDS)
        except Exception as error:  # a dropped notification costs latency, never data
            future.cancel()
            timed_out = isinstance(error, concurrent.futures.TimeoutError)
            log.warning("live notification to %s dropped%s", group,
                        f": not sent in {SEND_SECONDS:g} s" if timed_out else "",
                        exc_info=not timed_out)


_sender = _Sender()
# A forked child (Celery's pool) starts with no loop and a free lock.
os.register_at_fork(after_in_child=lambda: _sender.reset())


def notify(group: str, message: dict[str, Any]) -> None:
    """Send `message` to `group` after the current transaction commits (at once outside one)."""
    transaction.on_commit(lambda: _sender.send(get_channel_layer(), group, message))
