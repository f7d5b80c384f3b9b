"""The navigation's socket: on "the queue changed", the review-queue count for this socket's
user, as an out-of-band htmx swap; on the queue page also a "refresh" banner.

The count is re-read from the database on every notice, with the user's classes as they are
now, so a dropped notice or a reassigned reviewer is right again at the next one.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.template.loader import render_to_string

from infraops.roles import user_roles
from reviews.live import REVIEWS_GROUP, assigned_classes, awaiting_for_classes


class ReviewsConsumer(AsyncWebsocketConsumer):
    user_id: int
    on_queue_page: bool

    async def connect(self) -> None:
        user = self.scope.get("user")
        allowed = await database_sync_to_async(
            lambda: bool(user and user.is_authenticated and user_roles(user)))()
        if not allowed:
            await self.close(code=4403)
            return
        self.user_id = user.pk
        query = parse_qs(self.scope.get("query_string", b"").decode(errors="replace"))
        self.on_queue_page = query.get("page") == ["queue"]
        await self.channel_layer.group_add(REVIEWS_GROUP, self.channel_name)
        await self.accept()
        # The page may be older than the socket (a reconnect): catch the count up at once.
        await self.send(text_data=await database_sync_to_async(self.render)(stale=False))

    async def disconnect(self, code: int) -> None:
        if hasattr(self, "user_id"):
            await self.channel_layer.group_discard(REVIEWS_GROUP, self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        """The client has nothing to say on this socket."""

    async def reviews_changed(self, event: dict[str, Any]) -> None:
        html = await database_sync_to_async(self.render)(stale=self.on_queue_page)
        await self.send(text_data=html)

    def render(self, *, stale: bool) -> str:
        count = awaiting_for_classes(assigned_classes(self.user_id)).count()
        html = render_to_string("base.html#nav-queue-count", {"review_queue_count": count})
        if stale:
            html += render_to_string("reviews/queue.html#queue-stale", {"stale": True})
        return html
