"""A pytest plugin for runs under pytest-xdist (scripts/test.sh loads it with ``-p``).

Each worker process takes its own Redis database, counted down from REDIS_URL's number
(gw0 keeps it, gw1 takes the one below, ...), as pytest-django gives each its own PostgreSQL
database (``test_<name>_gw<N>``): the Celery workers, channel layer and caches of one worker's
tests then never meet another's, so a worker of one test never takes the task of a test in
another process. It runs at import, before pytest-django reads the settings.
"""

from __future__ import annotations

import os
import urllib.parse


def worker_redis_url(url: str, worker: str) -> str:
    """REDIS_URL for xdist worker `worker` ("gw0", "gw1", ...)."""
    parts = urllib.parse.urlsplit(url)
    base = int(parts.path.strip("/") or "0")
    number = base - int(worker.removeprefix("gw"))
    if number < 0:
        raise RuntimeError(f"REDIS_URL={url!r} leaves no Redis database for worker {worker}: "
                           "start from a higher database number or run fewer workers")
    return urllib.parse.urlunsplit(parts._replace(path=f"/{number}"))


_worker = os.environ.get("PYTEST_XDIST_WORKER")
if _worker and os.environ.get("REDIS_URL"):
    os.environ["REDIS_URL"] = worker_redis_url(os.environ["REDIS_URL"], _worker)


def spare_redis_url(k: int, url: str | None = None) -> str:
    """A Redis database of this test process's own besides REDIS_URL's, for a test that needs
    one to itself (a broker it empties, a whole system it starts): the `k`-th (1, 2, ...),
    counting down from REDIS_URL's database in steps of the number of test processes, so that
    no two processes, and no process and its spares, ever share one."""
    url = url or os.environ.get("REDIS_URL", "")
    if not url.startswith(("redis://", "rediss://")):
        raise RuntimeError(f"REDIS_URL={url!r}: the tests need a Redis server URL "
                           "(scripts/test.sh sets one)")
    parts = urllib.parse.urlsplit(url)
    processes = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    number = int(parts.path.strip("/") or "0") - k * processes
    if number < 0:
        raise RuntimeError(f"REDIS_URL={url!r} leaves no spare Redis database {k} for "
                           f"{processes} test process(es): start from a higher number")
    return urllib.parse.urlunsplit(parts._replace(path=f"/{number}"))
