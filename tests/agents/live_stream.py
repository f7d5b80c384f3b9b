"""What a run page's live log holds, read off the frames the socket sent; shared by
tests/agents/test_consumers.py and bench/live_log.py (docs/reliability.md W3, W4)."""

from __future__ import annotations

import html
import re

from agents.events import run_events_append
from agents.models import RunEvent

ROW = re.compile(r'<li class="event [^"]*" data-seq="(\d+)">.*?</time> (.*?)</li>', re.S)


def frame_rows(frame: str) -> list[tuple[int, str]]:
    """(seq, message) of every event row in one frame, in the order the page appends them."""
    return [(int(seq), html.unescape(message)) for seq, message in ROW.findall(frame)]


def database_transcript(run_id: int) -> list[tuple[int, str]]:
    return list(RunEvent.objects.filter(run_id=run_id).order_by("seq")
                .values_list("seq", "message"))


def append_lines(run_id: int, count: int, start: int = 0, batch: int = 1) -> None:
    """`count` log lines through the product's own append, `batch` lines (and one
    notification) per transaction."""
    for first in range(start, start + count, batch):
        numbers = range(first, min(first + batch, start + count))
        run_events_append(run_id=run_id, entries=[("status", f"log line {n:06d}", None)
                                                  for n in numbers])
