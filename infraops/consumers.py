"""Websockets that stream a sequenced log from the database.

The client says the last sequence number it has, on every connect, so a reconnect catches
up; a group message only says there is more. Rows always come from the database, so a
dropped notification costs latency, never a line.
"""

from __future__ import annotations

import json
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.template.loader import render_to_string

from infraops.models import Experiment, ExperimentLog
from infraops.roles import user_roles
from infraops.services.results import experiment_group

BATCH = 200


class SequencedLogConsumer(AsyncWebsocketConsumer):
    """Subclasses name the group, check access and render the rows after a number."""

    object_id: int
    last_sent: int
    client_ready: bool  # the client sent {"after": n}: only then do notifications send rows

    def group(self) -> str:
        raise NotImplementedError

    def may_view(self, user: Any) -> bool:
        raise NotImplementedError

    def render_after(self, after: int) -> tuple[str, int]:
        """HTML for up to BATCH rows after `after`, and the last number rendered."""
        raise NotImplementedError

    async def connect(self) -> None:
        self.object_id = int(self.scope["url_route"]["kwargs"]["pk"])
        self.last_sent = 0
        self.client_ready = False
        user = self.scope.get("user")
        allowed = await database_sync_to_async(
            lambda: bool(user and user.is_authenticated and user_roles(user)
                         and self.may_view(user)))()
        if not allowed:
            await self.close(code=4403)
            return
        await self.channel_layer.group_add(self.group(), self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        if hasattr(self, "object_id"):
            await self.channel_layer.group_discard(self.group(), self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        try:
            message = json.loads(text_data or "{}")
            after = message.get("after", 0)
        except (ValueError, AttributeError):
            return  # a malformed message asks for nothing
        if not isinstance(after, int) or isinstance(after, bool):
            return
        self.last_sent = max(after, 0)
        self.client_ready = True
        await self._send_new()

    async def notify_new(self, event: dict[str, Any]) -> None:
        # Not before the client said where it is: sending from 0 and then from its own number
        # would give it every row in between twice (seen on a run page that connected while
        # events arrived).
        if self.client_ready and int(event.get("upto", 0)) > self.last_sent:
            await self._send_new()

    async def _send_new(self) -> None:
        while True:
            html, last = await database_sync_to_async(self.render_after)(self.last_sent)
            if not html:
                return
            self.last_sent = last
            await self.send(text_data=html)


class ExperimentLogConsumer(SequencedLogConsumer):
    log_lines = SequencedLogConsumer.notify_new

    def group(self) -> str:
        return experiment_group(self.object_id)

    def may_view(self, user: Any) -> bool:
        return Experiment.objects.filter(pk=self.object_id).exists()

    def render_after(self, after: int) -> tuple[str, int]:
        rows = list(ExperimentLog.objects.filter(experiment_id=self.object_id, seq__gt=after)
                    .order_by("seq")[:BATCH])
        if not rows:
            return "", after
        experiment = Experiment.objects.get(pk=self.object_id)
        html = render_to_string("infraops/experiment.html#log-update",
                                {"experiment": experiment, "logs": rows})
        return html, rows[-1].seq
