"""Which queues have a live worker, so a page can say 'waiting for a worker with gpu'
instead of leaving a user to wonder.

Each worker process writes a key per queue it consumes into Redis every HEARTBEAT seconds,
with a TTL of three beats: a killed worker disappears within TTL seconds. Each beat also
renews one key per queue that any of its workers renews (QUEUE_PREFIX), so that a page asking
about one queue reads one key instead of scanning every worker's.
"""

from __future__ import annotations

import functools
import logging
import os
import threading

import redis
from django.conf import settings

log = logging.getLogger(__name__)

HEARTBEAT = 5.0
TTL = int(HEARTBEAT * 3)
PREFIX = "infraops:worker:"
BOOT_PREFIX = "infraops:worker-boot:"  # <nodename> -> the boot token of its main process
QUEUE_PREFIX = "infraops:queue-live:"  # <queue> -> renewed by every worker that consumes it


def _client() -> redis.Redis:
    return _client_of(settings.REDIS_URL)


@functools.lru_cache(maxsize=4)
def _client_of(url: str) -> redis.Redis:
    """One client (and its connection pool) per process and URL: a page that says whether a
    worker is live no longer opens a connection to ask (a connect and redis-py's two CLIENT
    SETINFO round trips a request). redis-py's pool is thread-safe and starts afresh in a
    forked child."""
    return redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)


def worker_beat(*, name: str, queues: list[str], boot: str = "") -> None:
    with _client().pipeline() as pipe:
        for queue in queues:
            pipe.set(f"{PREFIX}{queue}:{name}", "1", ex=TTL)
            pipe.set(f"{QUEUE_PREFIX}{queue}", "1", ex=TTL)
        if boot:
            pipe.set(f"{BOOT_PREFIX}{name}", boot, ex=TTL)
        pipe.execute()


def boot_alive(nodename: str, token: str) -> bool:
    """Whether the worker boot `token` of `nodename` is still running (raises RedisError)."""
    value = _client().get(f"{BOOT_PREFIX}{nodename}")
    if isinstance(value, bytes):
        value = value.decode()
    return value == token


def live_queues() -> set[str] | None:
    """Queues with at least one live worker; None when Redis cannot be asked."""
    try:
        keys = _client().scan_iter(match=f"{PREFIX}*", count=500)
        return {key.decode().removeprefix(PREFIX).rsplit(":", 1)[0] for key in keys}
    except redis.RedisError:
        log.warning("cannot read worker heartbeats", exc_info=True)
        return None


def queue_alive(queue: str) -> bool | None:
    """Whether a live worker consumes `queue`; None when Redis cannot be asked. One key read
    while one does; the scan of every worker's key (live_queues) only when none has said so,
    which also answers for a worker of a version that beats no queue key."""
    try:
        if _client().exists(f"{QUEUE_PREFIX}{queue}"):
            return True
    except redis.RedisError:
        log.warning("cannot read worker heartbeats", exc_info=True)
        return None
    live = live_queues()
    return None if live is None else queue in live


def missing_worker_message(queue: str) -> str | None:
    """A sentence for the page when nobody consumes `queue`; None when someone does."""
    alive = queue_alive(queue)
    if alive is None:
        return "Redis cannot be reached, so no work can be queued or picked up."
    if alive:
        return None
    needs = queue.split(".")[1:]
    wanted = f"a worker with {' and '.join(needs)}" if needs else "a worker"
    return (f"Waiting for {wanted}: no live worker consumes queue {queue!r}. Start one with "
            f"`celery -A infraops.project worker -Q {queue}`.")


# What a tick meets when a server it talks to is gone (Redis restarting or stopped before this
# worker at shutdown, a network cut): said in one line, once until it answers again.
UNREACHABLE = (redis.ConnectionError, redis.TimeoutError, ConnectionError, TimeoutError)


class Periodic:
    """A daemon thread calling `tick()` every `interval` seconds until stopped. A tick that
    raises is logged (a server out of reach in one line, once until it answers again, where
    a traceback would say nothing more); the next one runs as planned."""

    thread_name = "infraops-periodic"

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
        self._unreachable = False

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def tick(self) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except UNREACHABLE as exc:
                if not self._unreachable:
                    log.warning("%s: out of reach (%s: %s); trying again every %g s",
                                self.thread_name, type(exc).__name__, exc, self.interval)
                self._unreachable = True
            except Exception:  # the thread must outlive any one bad tick
                log.warning("%s failed", self.thread_name, exc_info=True)
            else:
                if self._unreachable:
                    log.info("%s: reachable again", self.thread_name)
                self._unreachable = False
            self._stop.wait(self.interval)


class Heartbeat(Periodic):
    """Beats for one worker process until stopped."""

    thread_name = "infraops-heartbeat"

    def __init__(self, name: str, queues: list[str], boot: str = "") -> None:
        super().__init__(HEARTBEAT)
        self.name, self.queues, self.boot = name, queues, boot

    def tick(self) -> None:
        worker_beat(name=self.name, queues=self.queues, boot=self.boot)


def this_boot() -> tuple[str, str]:
    """(worker nodename, boot token) of the worker this process belongs to; '' outside one.
    The worker's main process names them before its pool forks (infraops.project.celery)."""
    return (os.environ.get("INFRAOPS_WORKER_NAME", ""), os.environ.get("INFRAOPS_WORKER_BOOT", ""))
