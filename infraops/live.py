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
