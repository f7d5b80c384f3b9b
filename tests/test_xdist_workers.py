"""tests/xdist_workers.py: each xdist worker process gets a Redis database of its own."""

from __future__ import annotations

import pytest

from tests.xdist_workers import worker_redis_url


@pytest.mark.parametrize(("url", "worker", "expected"), [
    ("redis://127.0.0.1:6379/14", "gw0", "redis://127.0.0.1:6379/14"),
    ("redis://127.0.0.1:6379/14", "gw1", "redis://127.0.0.1:6379/13"),
    ("redis://:secret@127.0.0.1:6379/3?protocol=3", "gw2", "redis://:secret@127.0.0.1:6379/1?protocol=3"),
    ("redis://127.0.0.1:6379", "gw0", "redis://127.0.0.1:6379/0"),
])
def test_each_worker_counts_down_from_the_url_database(url: str, worker: str,
                                                       expected: str) -> None:
    assert worker_redis_url(url, worker) == expected


def test_a_worker_past_database_zero_is_refused_in_words() -> None:
    with pytest.raises(RuntimeError, match="leaves no Redis database for worker gw2"):
        worker_redis_url("redis://127.0.0.1:6379/1", "gw2")
