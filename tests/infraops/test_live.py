"""infraops.live: notifications sent after the commit, on one event loop a process, so that the
channel layer's Redis connection is made once rather than once a notification."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from channels_redis import pubsub
from channels_redis.pubsub import RedisPubSubChannelLayer

from infraops import live
from tests.reviews.test_queue import TIMEOUT, run_async

GROUP = "live-test"


@pytest.fixture
def loop_layers(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every per-loop layer (one Redis connection each) the channel layer makes."""
    made: list[object] = []

    class Counted(pubsub.RedisPubSubLoopLayer):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(pubsub, "RedisPubSubLoopLayer", Counted)
    return made


@pytest.fixture
def sender(monkeypatch: pytest.MonkeyPatch) -> live._Sender:
    fresh = live._Sender()
    monkeypatch.setattr(live, "_sender", fresh)
    return fresh


@pytest.mark.django_db(transaction=True)
def test_notifications_reach_the_group_in_order_over_one_connection(
        loop_layers: list[object], sender: live._Sender) -> None:
    layer = get_channel_layer()
    assert layer is not None

    async def scenario() -> list[dict[str, Any]]:
        channel = await layer.new_channel()
        await layer.group_add(GROUP, channel)
        for n in range(5):
            await sync_to_async(live.notify)(GROUP, {"type": "test.note", "n": n})
        received = [await asyncio.wait_for(layer.receive(channel), TIMEOUT) for _ in range(5)]
        await layer.group_discard(GROUP, channel)
        return received

    received = run_async(scenario)

    assert [m["n"] for m in received] == [0, 1, 2, 3, 4]
    # The subscriber's loop and the sender's: async_to_sync made one a notification (5 more).
    assert len(loop_layers) == 2
    assert sender.loop is not None and sender.loop.is_running()


def test_a_forked_process_gets_a_loop_of_its_own_and_a_free_lock() -> None:
    first = live._sender._loop()
    assert live._sender._loop() is first
    with live._sender.lock:  # held by another thread of the parent at the fork
        child = os.fork()
        if child == 0:  # the child: no loop, a free lock, a loop of its own that runs
            fresh = live._sender.loop is None and live._sender.lock.acquire(timeout=5)
            if fresh:
                live._sender.lock.release()
            loop = live._sender._loop() if fresh else first
            runs = loop is not first and asyncio.run_coroutine_threadsafe(
                asyncio.sleep(0, "ran"), loop).result(timeout=10) == "ran"
            os._exit(0 if runs else 1)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert live._sender._loop() is first


def test_an_unreachable_redis_drops_the_notification_in_words_and_the_next_one_goes(
        sender: live._Sender, caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    unreachable = RedisPubSubChannelLayer(hosts=[f"redis://127.0.0.1:{port}/0"])

    with caplog.at_level(logging.WARNING, logger="infraops.live"):
        sender.send(unreachable, GROUP, {"type": "test.note"})

    assert "live notification to live-test dropped" in caplog.text
    layer = get_channel_layer()
    assert layer is not None
    sender.send(layer, GROUP, {"type": "test.note"})  # the loop still serves
    assert sender.loop is not None and sender.loop.is_running()
