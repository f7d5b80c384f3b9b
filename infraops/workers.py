"""Which queues have a live worker, so a page can say 'waiting for a worker with gpu'
instead of leaving a user to wonder.

Each worker process writes a key per queue it consumes into Redis every HEARTBEAT seconds,
with a TTL of three beats: a killed worker disappears within TTL seconds.
"""

from __future__ import annotations

import logging
import threading

import redis
from django.conf import settings

log = logging.getLogger(__name__)

HEARTBEAT = 5.0
TTL = int(HEARTBEAT * 3)
PREFIX = "infraops:worker:"


def _client() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)


def worker_beat(*, name: str, queues: list[str]) -> None:
    with _client().pipeline() as pipe:
        for queue in queues:
            pipe.set(f"{PREFIX}{queue}:{name}", "1", ex=TTL)
        pipe.execute()


def live_queues() -> set[str] | None:
    """Queues with at least one live worker; None when Redis cannot be asked."""
    try:
        keys = _client().scan_iter(match=f"{PREFIX}*", count=500)
        return {key.decode().removeprefix(PREFIX).rsplit(":", 1)[0] for key in keys}
    except redis.RedisError:
        log.warning("cannot read worker heartbeats", exc_info=True)
        return None


def missing_worker_message(queue: str) -> str | None:
    """A sentence for the page when nobody consumes `queue`; None when someone does."""
    live = live_queues()
    if live is None:
        return "Redis cannot be reached, so no work can be queued or picked up."
    if queue in live:
        return None
    needs = queue.split(".")[1:]
    wanted = f"a worker with {' and '.join(needs)}" if needs else "a worker"
    return (f"Waiting for {wanted}: no live worker consumes queue {queue!r}. Start one with "
            f"`celery -A infraops worker -Q {queue}`.")


class Heartbeat:
    """A daemon thread beating for one worker process until stopped."""

    def __init__(self, name: str, queues: list[str]) -> None:
        self.name, self.queues = name, queues
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="infraops-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                worker_beat(name=self.name, queues=self.queues)
            except redis.RedisError:
                log.warning("worker heartbeat failed", exc_info=True)
            self._stop.wait(HEARTBEAT)
