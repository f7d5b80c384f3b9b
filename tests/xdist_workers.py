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
