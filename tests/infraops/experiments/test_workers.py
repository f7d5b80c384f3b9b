"""infraops/experiments/workers.py: worker heartbeats in Redis, and the sentence shown when none
beats.

Each test uses its own queue names so that real workers on the same Redis never interfere."""

from __future__ import annotations

import logging
import threading
import time
import uuid

import pytest
import redis

from infraops.experiments import workers


@pytest.fixture
def prefix() -> str:
    """A unique first part of queue names: '<prefix>.gpu' still means 'needs a gpu'."""
    return f"test{uuid.uuid4().hex[:12]}"


def test_with_no_worker_beating_it_says_which_worker_to_start(prefix: str) -> None:
    queue = f"{prefix}.gpu"

    message = workers.missing_worker_message(queue)

    assert message is not None
    assert message.startswith("Waiting for a worker with gpu")
    assert f"-Q {queue}" in message


def test_a_queue_without_hardware_asks_for_any_worker(prefix: str) -> None:
    message = workers.missing_worker_message(prefix)

    assert message is not None
    assert message.startswith("Waiting for a worker:")


def test_a_beating_worker_silences_the_message_for_its_queues_only(prefix: str) -> None:
    workers.worker_beat(name="w1", queues=[f"{prefix}.gpu"])

    assert workers.missing_worker_message(f"{prefix}.gpu") is None
    assert f"{prefix}.gpu" in (workers.live_queues() or set())
    assert workers.missing_worker_message(f"{prefix}.tpu") is not None


def test_a_page_asking_about_a_served_queue_reads_one_key_not_every_workers(
    prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    workers.worker_beat(name="w1", queues=[f"{prefix}.gpu"])
    client = workers._client()
    scans: list[str] = []
    real_scan = client.scan_iter

    def counted_scan(*args: object, **kwargs: object) -> object:
        scans.append(str(kwargs.get("match")))
        return real_scan(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(client, "scan_iter", counted_scan)

    assert workers.missing_worker_message(f"{prefix}.gpu") is None
    assert scans == []  # the run page asks this on every read
    assert workers.missing_worker_message(f"{prefix}.tpu") is not None  # none: it looks closer
    assert len(scans) == 1


def test_a_worker_that_beats_no_queue_key_still_counts(prefix: str) -> None:
    # A worker of the version before queue keys (or one whose queue key was lost): its own
    # key is enough, found by the scan.
    workers._client().set(f"{workers.PREFIX}{prefix}.gpu:old-worker", "1", ex=workers.TTL)

    assert workers.queue_alive(f"{prefix}.gpu") is True
    assert workers.missing_worker_message(f"{prefix}.gpu") is None


def test_a_worker_that_stops_beating_disappears_after_the_ttl(
    prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(workers, "TTL", 1)
    workers.worker_beat(name="w1", queues=[f"{prefix}.gpu"])
    assert workers.missing_worker_message(f"{prefix}.gpu") is None

    time.sleep(1.5)

    message = workers.missing_worker_message(f"{prefix}.gpu")
    assert message is not None
    assert message.startswith("Waiting for a worker with gpu")


def test_the_heartbeat_thread_beats_until_stopped(
    prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(workers, "TTL", 1)
    monkeypatch.setattr(workers, "HEARTBEAT", 0.2)
    beat = workers.Heartbeat("w2", [f"{prefix}.gpu"])
    beat.start()
    try:
        time.sleep(1.5)  # longer than the TTL: only renewed keys are still there
        assert workers.missing_worker_message(f"{prefix}.gpu") is None
    finally:
        beat.stop()
        beat._thread.join(timeout=5)
    assert not beat._thread.is_alive()

    time.sleep(1.5)
    assert workers.missing_worker_message(f"{prefix}.gpu") is not None


def test_a_server_out_of_reach_is_said_once_in_one_line_until_it_answers_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Redis stopped before the worker (a Ctrl-C reaches both at once) or restarting: a warning
    # with a traceback every beat said nothing more than its first line.
    outcomes = [redis.ConnectionError("Error 2 connecting to /data/redis.sock."),
                redis.ConnectionError("Connection closed by server."), None,
                ValueError("a bug")]
    done = threading.Event()

    class Ticks(workers.Periodic):
        thread_name = "infraops-test-ticks"

        def tick(self) -> None:
            if not outcomes:
                done.set()
                return
            outcome = outcomes.pop(0)
            if outcome is not None:
                raise outcome

    caplog.set_level(logging.INFO, logger=workers.log.name)
    ticks = Ticks(0.01)
    ticks.start()
    try:
        assert done.wait(timeout=60)
    finally:
        ticks.stop()
    said = [(r.levelname, r.getMessage(), r.exc_info is not None) for r in caplog.records]
    assert said[:3] == [
        ("WARNING", "infraops-test-ticks: out of reach (ConnectionError: Error 2 connecting to "
                    "/data/redis.sock.); trying again every 0.01 s", False),
        ("INFO", "infraops-test-ticks: reachable again", False),
        ("WARNING", "infraops-test-ticks failed", True),  # anything else keeps its traceback
    ]


def test_an_unreachable_redis_is_said_in_words(settings, prefix: str) -> None:
    settings.REDIS_URL = "redis://127.0.0.1:1/0"

    assert workers.live_queues() is None
    message = workers.missing_worker_message(f"{prefix}.gpu")
    assert message is not None
    assert "Redis cannot be reached" in message
