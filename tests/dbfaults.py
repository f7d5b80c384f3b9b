"""Dropped database connections for the fault tests (issue 28, item 1; docs/reliability.md
C8 and C9): PostgreSQL's pg_terminate_backend, sent from a connection of the test's own, on
backends of the test database only."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

import psycopg
from django.db import connection

T = TypeVar("T")


def dsn() -> str:
    """The test database's connection string, for a psycopg connection apart from Django's."""
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    parts = {key: params[key] for key in ("host", "port", "user", "password", "dbname")
             if params.get(key)}
    return " ".join(f"{key}={value}" for key, value in parts.items())


def terminate_own_backend() -> None:
    """Terminate the backend of this thread's Django connection (opening one if needed):
    its next query raises OperationalError, as after a restart or a failover."""
    connection.ensure_connection()
    assert connection.connection is not None
    pid = connection.connection.info.backend_pid
    with psycopg.connect(dsn(), autocommit=True) as own:
        own.execute("SELECT pg_terminate_backend(%s)", (pid,))


def cutting(function: Callable[..., T], times: int, *, after: bool = False
            ) -> tuple[Callable[..., T], list[int]]:
    """`function`, whose first `times` calls terminate their thread's connection before they
    run (or, `after`, once they have run: what they did outside the database stays done); and
    the list that counts the cuts made."""
    cuts: list[int] = []
    lock = threading.Lock()

    def due() -> bool:
        with lock:
            if len(cuts) >= times:
                return False
            cuts.append(1)
            return True

    def cut(*args: object, **kwargs: object) -> T:
        if not after and due():
            terminate_own_backend()
        result = function(*args, **kwargs)
        if after and due():
            terminate_own_backend()
        return result

    return cut, cuts


class Terminator(threading.Thread):
    """From a connection of its own: terminate every other backend of the test database
    `times` times, `every` seconds apart, from its start until `stop` is set."""

    def __init__(self, *, times: int, every: float) -> None:
        super().__init__(daemon=True)
        self.dsn, self.times, self.every = dsn(), times, every
        self.stop, self.done = threading.Event(), 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with psycopg.connect(self.dsn, autocommit=True) as own:
                while self.done < self.times and not self.stop.wait(self.every):
                    own.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
                                "datname = current_database() AND pid <> pg_backend_pid()")
                    self.done += 1
        except BaseException as exc:
            self.error = exc
            raise
