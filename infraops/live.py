"""Live notifications: sent through the channel layer after the commit that made them true.

The channel layer may drop a message; pages never depend on it alone (they catch up from
the database by sequence number).
"""

from __future__ import annotations

import logging
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

log = logging.getLogger(__name__)

CURSOR_MAX = 2**31 - 1  # a PositiveIntegerField's top: any larger 'after' means 'after all'


def cursor(text: str | None) -> int:
    """A sequence number from an address (?after=N); anything else (abc, -1, 1e9, '²') is 0."""
    if not text or not (text.isascii() and text.isdigit()):
        return 0
    return CURSOR_MAX if len(text) > 10 else min(int(text), CURSOR_MAX)


def notify(group: str, message: dict[str, Any]) -> None:
    def send() -> None:
        layer = get_channel_layer()
        if layer is None:
            return
        try:
            async_to_sync(layer.group_send)(group, message)
        except Exception:  # a dropped notification costs latency, never data
            log.warning("live notification to %s dropped", group, exc_info=True)

    transaction.on_commit(send)
