"""The run page's websocket: 'new events up to N' in, rendered rows out.

Session and role re-checks, frame limits and the fetch-over-HTTP frame come from
infraops.consumers.SequencedLogConsumer.
"""

from __future__ import annotations

from typing import Any

from django.template.loader import render_to_string

from agents.events import run_group
from agents.models import AgentRun, RunEvent
from infraops.access import scoped, target_roles
from infraops.consumers import BATCH, SequencedLogConsumer


class RunConsumer(SequencedLogConsumer):
    run_events = SequencedLogConsumer.notify_new
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
        events = list(RunEvent.objects.filter(run_id=self.object_id, seq__gt=after)
                      .order_by("seq")[:limit])
        if not events:
            return "", after
        run = AgentRun.objects.select_related("goal_version__goal__target", "target").get(
            pk=self.object_id)
        roles = target_roles(self.scope["user"], run.target_id)  # the controls depend on who
        html = render_to_string("agents/run.html#live-update",
                                {"run": run, "events": events, "target_roles": roles})
        return html, events[-1].seq
