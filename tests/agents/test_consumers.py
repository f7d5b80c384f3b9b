"""agents/consumers.py through infraops.project.asgi.application: who may open a run's socket, and
which rendered event rows it sends (after N on request, new rows when an event is appended).

The run is made with the ORM rather than agents.services.run_start, which would send a real
Celery task to the test broker. Events are appended with agents.events.run_event in committed
transactions, so the notification goes through the real Redis channel layer.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import re
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.test import Client

from agents.events import run_event
from agents.models import AgentRun
from infraops.models import Goal
from infraops.project.asgi import application
from tests.agents.live_stream import append_lines, database_transcript, frame_rows
from tests.factories import AgentRunFactory, UserFactory

pytestmark = [pytest.mark.django_db(transaction=True),
              pytest.mark.usefixtures("close_thread_connections")]

ORIGIN = (b"origin", b"http://localhost")
TIMEOUT = 5
DEADLINE = 60  # seconds to wait for a condition on a loaded machine


def run_async(scenario: Callable[[], Awaitable[Any]]) -> Any:
    return async_to_sync(scenario)()


def session_headers(user: User | None, origin: tuple[bytes, bytes] = ORIGIN
                    ) -> list[tuple[bytes, bytes]]:
    headers = [origin]
    if user is not None:
        client = Client()
        client.force_login(user)
        headers.append((b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode()))
    return headers


def seqs(html: str) -> list[int]:
    return [int(n) for n in re.findall(r'data-seq="(\d+)"', html)]


@pytest.fixture
def run(example_goal: Goal, engineer: User) -> AgentRun:
    made = AgentRunFactory.create(goal=example_goal, started_by=engineer)
    for message in ("Run started.", "Step 1: batch_size 4.", "<script>alert(1)</script>"):
        run_event(run_id=made.pk, kind="status", message=message)
    return made


def connect(run_id: int, headers: list[tuple[bytes, bytes]]) -> tuple[bool, Any]:
    async def scenario() -> tuple[bool, Any]:
        communicator = WebsocketCommunicator(application, f"/ws/runs/{run_id}/", headers=headers)
        connected, detail = await communicator.connect(timeout=TIMEOUT)
        if connected:
            await communicator.disconnect()
        return connected, detail

    return run_async(scenario)


def test_an_anonymous_socket_is_refused(run: AgentRun) -> None:
    assert connect(run.pk, session_headers(None)) == (False, 4403)


def test_a_user_with_no_role_is_refused(run: AgentRun) -> None:
    nobody = UserFactory.create(username="nora", roles=[])

    assert connect(run.pk, session_headers(nobody)) == (False, 4403)


def test_a_viewer_is_refused_for_a_run_that_does_not_exist(run: AgentRun, viewer: User) -> None:
    assert connect(run.pk + 1000, session_headers(viewer)) == (False, 4403)


def test_a_foreign_origin_is_refused_even_with_a_session(run: AgentRun, viewer: User) -> None:
    connected, _ = connect(run.pk, session_headers(viewer, (b"origin", b"http://evil.example")))

    assert connected is False


def test_a_viewer_is_accepted(run: AgentRun, viewer: User) -> None:
    assert connect(run.pk, session_headers(viewer)) == (True, None)


def test_after_zero_returns_every_event_row_of_the_run(run: AgentRun, viewer: User) -> None:
    async def scenario() -> str:
        communicator = WebsocketCommunicator(application, f"/ws/runs/{run.pk}/",
                                             headers=session_headers(viewer))
        assert (await communicator.connect(timeout=TIMEOUT))[0]
        await communicator.send_json_to({"after": 0})
        html = await communicator.receive_from(timeout=TIMEOUT)
        assert await communicator.receive_nothing(timeout=0.5)
        await communicator.disconnect()
        return str(html)

    html = run_async(scenario)

    assert seqs(html) == [1, 2, 3]
    assert "Run started." in html and "Step 1: batch_size 4." in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<script>" not in html
    assert 'id="run-events"' in html and 'id="run-status"' in html


def test_a_new_event_sends_only_its_row_to_a_socket_that_is_up_to_date(
    run: AgentRun, viewer: User
) -> None:
    append = sync_to_async(run_event)

    async def scenario() -> tuple[bool, str, bool]:
        communicator = WebsocketCommunicator(application, f"/ws/runs/{run.pk}/",
                                             headers=session_headers(viewer))
        assert (await communicator.connect(timeout=TIMEOUT))[0]
        await communicator.send_json_to({"after": 3})
        caught_up = await communicator.receive_nothing(timeout=0.5)
        await append(run_id=run.pk, kind="step", message="Step 2: batch_size 8.")
        html = await communicator.receive_from(timeout=TIMEOUT)
        nothing_more = await communicator.receive_nothing(timeout=0.5)
        await communicator.disconnect()
        return caught_up, str(html), nothing_more

    caught_up, html, nothing_more = run_async(scenario)

    assert caught_up  # nothing after 3 until the new event
    assert seqs(html) == [4]
    assert "Step 2: batch_size 8." in html
    assert "Run started." not in html
    assert nothing_more  # the notification does not send the row a second time


def test_a_notification_before_the_client_says_where_it_is_sends_nothing_twice(
    run: AgentRun, viewer: User
) -> None:
    """The page has rows 1-3 when its socket opens; an event lands before the page's
    {"after": 3}: the page must get row 4 once, not 1-4 and then 4 again."""
    append = sync_to_async(run_event)

    async def scenario() -> list[str]:
        communicator = WebsocketCommunicator(application, f"/ws/runs/{run.pk}/",
                                             headers=session_headers(viewer))
        assert (await communicator.connect(timeout=TIMEOUT))[0]
        await append(run_id=run.pk, kind="step", message="Step 2: batch_size 8.")
        early = await communicator.receive_nothing(timeout=0.5)
        await communicator.send_json_to({"after": 3})
        received = [str(await communicator.receive_from(timeout=TIMEOUT))]
        while not await communicator.receive_nothing(timeout=0.5):
            received.append(str(await communicator.receive_from(timeout=TIMEOUT)))
        await communicator.disconnect()
        assert early, "rows were sent before the client said where it is"
        return received

    received = run_async(scenario)

    assert [seqs(html) for html in received] == [[4]]


def test_after_n_sends_only_the_rows_after_n(run: AgentRun, viewer: User) -> None:
    async def scenario() -> str:
        communicator = WebsocketCommunicator(application, f"/ws/runs/{run.pk}/",
                                             headers=session_headers(viewer))
        assert (await communicator.connect(timeout=TIMEOUT))[0]
        await communicator.send_json_to({"after": 1})
        html = await communicator.receive_from(timeout=TIMEOUT)
        await communicator.disconnect()
        return str(html)

    assert seqs(run_async(scenario)) == [2, 3]


@pytest.mark.parametrize("malformed", [
    "not json", '{"after": "x"}', "[1, 2]", "null", '{"after": NaN}',
    '{"after": 1e999}',
])
def test_a_malformed_message_gets_no_reply_and_keeps_the_socket_open(
    run: AgentRun, viewer: User, malformed: str
) -> None:
    async def scenario() -> tuple[bool, str]:
        communicator = WebsocketCommunicator(application, f"/ws/runs/{run.pk}/",
                                             headers=session_headers(viewer))
        assert (await communicator.connect(timeout=TIMEOUT))[0]
        await communicator.send_to(text_data=malformed)
        silent = await communicator.receive_nothing(timeout=0.5)
        await communicator.send_json_to({"after": 2})
        html = await communicator.receive_from(timeout=TIMEOUT)
        await communicator.disconnect()
        return silent, str(html)

    silent, html = run_async(scenario)

    assert silent  # no reply, and no close message either
    assert seqs(html) == [3]  # the socket still answers


# --- backpressure and resume (docs/reliability.md W3, W4) ------------------------------------

def queued_notifications() -> int:
    """Group messages this event loop's channel layer holds, not yet taken by a socket."""
    layer = get_channel_layer()._get_layer()  # type: ignore[union-attr]
    return sum(queue.qsize() for queue in layer.channels.values())


def with_stalled_sends(gate: asyncio.Event, waiting: list[int]) -> Any:
    """The application as a client that reads nothing until `gate` is set makes it: every
    websocket.send waits, as the server's does once the client's TCP window is full."""
    async def app(scope: Any, receive: Any, send: Any) -> None:
        async def held(message: dict[str, Any]) -> None:
            if message["type"] == "websocket.send" and not gate.is_set():
                waiting.append(1)
                await gate.wait()
            await send(message)
        await application(scope, receive, held)
    return app


async def wait_until(condition: Callable[[], bool], seconds: float = DEADLINE) -> bool:
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while not condition():
        if loop.time() > end:
            return False
        await asyncio.sleep(0.05)
    return True


async def read_rows(communicator: WebsocketCommunicator, *, through: int
                    ) -> list[tuple[int, str]]:
    """Frames until the row numbered `through` (or a later one) arrived."""
    rows: list[tuple[int, str]] = []
    while not rows or rows[-1][0] < through:
        rows += frame_rows(str(await communicator.receive_from(timeout=DEADLINE)))
    return rows


def test_a_row_whose_notification_was_lost_still_reaches_a_ready_client(
    run: AgentRun, viewer: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A notification can be lost (one published before the socket's subscription took effect
    on Redis reaches nobody): an idle socket reads its rows again every REREAD_SECONDS, so
    the last rows of a run reach the page without waiting for another event."""
    produce = sync_to_async(append_lines, thread_sensitive=False)
    last_seq = sync_to_async(lambda: AgentRun.objects.get(pk=run.pk).event_seq,
                             thread_sensitive=False)

    async def scenario() -> list[tuple[int, str]]:
        communicator = WebsocketCommunicator(application, f"/ws/runs/{run.pk}/",
                                             headers=session_headers(viewer))
        assert (await communicator.connect(timeout=TIMEOUT))[0]
        await communicator.send_json_to({"after": 0})
        await produce(run.pk, 1)  # notified: the socket is ready and sends it
        rows = await read_rows(communicator, through=await last_seq())
        await asyncio.sleep(0.5)  # no notification of that row is still on its way
        monkeypatch.setattr("agents.events.notify", lambda *args, **kwargs: None)
        await produce(run.pk, 1, start=1)  # committed, its notification lost
        rows += await read_rows(communicator, through=await last_seq())
        await communicator.disconnect()
        return rows

    rows = run_async(scenario)

    assert [text for _, text in rows][-2:] == ["log line 000000", "log line 000001"]


def test_notifications_do_not_pile_up_behind_a_client_that_reads_nothing_and_it_gets_every_row(
    run: AgentRun, viewer: User, caplog: pytest.LogCaptureFixture
) -> None:
    """2,000 lines, each with its notification, while the socket's first frame waits on a
    client that reads nothing: the server keeps no queue of notifications for it, and once
    the client reads, its transcript is the database's, every row once."""
    lines = 2_000
    produce = sync_to_async(append_lines, thread_sensitive=False)

    async def scenario() -> tuple[bool, int, list[tuple[int, str]]]:
        gate, waiting = asyncio.Event(), list[int]()
        communicator = WebsocketCommunicator(with_stalled_sends(gate, waiting),
                                             f"/ws/runs/{run.pk}/", headers=session_headers(viewer))
        assert (await communicator.connect(timeout=TIMEOUT))[0]
        await communicator.send_json_to({"after": 0})
        await produce(run.pk, lines)
        drained = await wait_until(lambda: queued_notifications() == 0)
        stalled = len(waiting)
        gate.set()
        rows = await read_rows(communicator, through=3 + lines)
        await communicator.disconnect()
        return drained, stalled, rows

    drained, stalled, rows = run_async(scenario)

    assert stalled == 1  # the socket was waiting on the client all along
    assert drained, "notifications queued on the server behind the stalled client"
    assert rows == database_transcript(run.pk)
    assert [seq for seq, _ in rows] == list(range(1, 3 + lines + 1))
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


def test_a_client_that_drops_five_times_at_random_and_resumes_gets_every_row_exactly_once(
    run: AgentRun, viewer: User
) -> None:
    """1,000 lines appended while the client reads; it disconnects at 5 random points and
    reconnects with {"after": the last row it has}, as static/js/live-log.js does."""
    lines, seed = 1_000, int.from_bytes(os.urandom(4), "big")
    cuts = sorted(random.Random(seed).sample(range(1, lines), 5))
    produce = sync_to_async(append_lines, thread_sensitive=False)

    async def scenario() -> list[tuple[int, str]]:
        producer = asyncio.ensure_future(produce(run.pk, lines))
        rows: list[tuple[int, str]] = []
        for cut in [*cuts, 3 + lines]:
            communicator = WebsocketCommunicator(application, f"/ws/runs/{run.pk}/",
                                                 headers=session_headers(viewer))
            assert (await communicator.connect(timeout=TIMEOUT))[0]
            await communicator.send_json_to({"after": rows[-1][0] if rows else 0})
            rows += await read_rows(communicator, through=cut)
            await communicator.disconnect()  # frames still on their way are lost
        await producer
        return rows

    rows = run_async(scenario)

    assert [seq for seq, _ in rows] == list(range(1, 3 + lines + 1)), f"seed {seed}, cuts {cuts}"
    assert rows == database_transcript(run.pk)
