"""The run page's websocket: 'new events up to N' in, rendered rows out."""

from __future__ import annotations

from typing import Any

from django.template.loader import render_to_string

from agents.events import run_group
from agents.models import AgentRun, RunEvent
from infraops.consumers import BATCH, SequencedLogConsumer
from infraops.roles import user_roles


class RunConsumer(SequencedLogConsumer):
    run_events = SequencedLogConsumer.notify_new

    def group(self) -> str:
        return run_group(self.object_id)

    def may_view(self, user: Any) -> bool:
        return AgentRun.objects.filter(pk=self.object_id).exists()

    def render_after(self, after: int) -> tuple[str, int]:
        events = list(RunEvent.objects.filter(run_id=self.object_id, seq__gt=after)
                      .order_by("seq")[:BATCH])
        if not events:
            return "", after
        run = AgentRun.objects.select_related("goal_version__goal", "target").get(pk=self.object_id)
        roles = user_roles(self.scope["user"])  # the controls depend on who is watching
        html = render_to_string("agents/run.html#live-update",
                                {"run": run, "events": events, "user_roles": roles})
        return html, events[-1].seq
