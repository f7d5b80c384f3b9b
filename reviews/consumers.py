"""The navigation's socket: on "the queue changed", the review-queue count for this socket's
user, as an out-of-band htmx swap; on the queue page also a "refresh" banner, on the
dashboard also its "N changes awaiting review" line (the same count, so the two agree).

The count is re-read from the database on every notice, with the user's classes as they are
now, so a dropped notice or a reassigned reviewer is right again at the next one. Session
and role re-checks and frame limits come from infraops.consumers.GuardedConsumer.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from django.template.loader import render_to_string

from infraops.consumers import GuardedConsumer
from reviews.live import REVIEWS_GROUP, assigned_classes, count_awaiting


class ReviewsConsumer(GuardedConsumer):
    on_queue_page: bool
    on_dashboard: bool
    joined = False

    async def connect(self) -> None:
        query = parse_qs(self.scope.get("query_string", b"").decode(errors="replace"))
        self.on_queue_page = query.get("page") == ["queue"]
        self.on_dashboard = query.get("page") == ["dashboard"]
        if not await self.guard_connect():
            return
        await self.channel_layer.group_add(REVIEWS_GROUP, self.channel_name)
        self.joined = True
        # The page may be older than the socket (a reconnect): catch the count up at once.
        await self.guarded_send(await database_sync_to_async(self.render)(stale=False))

    async def disconnect(self, code: int) -> None:
        await super().disconnect(code)
        if self.joined:
            await self.channel_layer.group_discard(REVIEWS_GROUP, self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        """The client has nothing to say on this socket."""

    async def reviews_changed(self, event: dict[str, Any]) -> None:
        html = await database_sync_to_async(self.render)(stale=self.on_queue_page)
        await self.guarded_send(html)

    def render(self, *, stale: bool) -> str:
        user = self._session_user()
        if user is None:
            return ""  # signed out meanwhile: the re-check closes the socket
        count = count_awaiting(user, assigned_classes(user.pk))
        html = render_to_string("base.html#nav-queue-count", {"review_queue_count": count})
        if self.on_dashboard:
            html += render_to_string("base.html#awaiting-review-line",
                                     {"review_queue_count": count})
        if stale:
            html += render_to_string("reviews/queue.html#queue-stale", {"stale": True})
        return html
