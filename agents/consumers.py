"""The run page's websocket: 'new events up to N' in, rendered rows out.

The client says the last sequence number it has (on every connect, so a reconnect
catches up); the group message only says there is more. Rows come from the database.
"""

from __future__ import annotations

import json
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.template.loader import render_to_string

from agents.events import run_group
from agents.models import AgentRun, RunEvent
from infraops.roles import user_roles

BATCH = 200


class RunConsumer(AsyncWebsocketConsumer):
    run_id: int
    last_sent: int

    async def connect(self) -> None:
        self.run_id = int(self.scope["url_route"]["kwargs"]["run_id"])
        self.last_sent = 0
        if not await self._may_view(self.scope.get("user")):
            await self.close(code=4403)
            return
        await self.channel_layer.group_add(run_group(self.run_id), self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        await self.channel_layer.group_discard(run_group(self.run_id), self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        try:
            message = json.loads(text_data or "{}")
            after = int(message.get("after", 0))
        except (ValueError, TypeError, AttributeError):
            return  # a malformed message asks for nothing
        self.last_sent = max(after, 0)
        await self._send_new()

    async def run_events(self, event: dict[str, Any]) -> None:
        if int(event.get("upto", 0)) > self.last_sent:
            await self._send_new()

    async def _send_new(self) -> None:
        while True:
            html, last = await self._render_after(self.last_sent)
            if not html:
                return
            self.last_sent = last
            await self.send(text_data=html)

    @database_sync_to_async
    def _may_view(self, user: Any) -> bool:
        return bool(user and user.is_authenticated and user_roles(user)
                    and AgentRun.objects.filter(pk=self.run_id).exists())

    @database_sync_to_async
    def _render_after(self, after: int) -> tuple[str, int]:
        events = list(RunEvent.objects.filter(run_id=self.run_id, seq__gt=after)
                      .order_by("seq")[:BATCH])
        if not events:
            return "", after
        run = AgentRun.objects.select_related("goal_version__goal", "target").get(pk=self.run_id)
        html = render_to_string("agents/run.html#live-update", {"run": run, "events": events})
        return html, events[-1].seq
