"""Transient database errors retried: a dropped connection costs a reconnect, not the work.

Measured (issue 28): `pg_terminate_backend` on the workers' connections during an experiment
ended it `failed` ("unexpected error OperationalError ... in flush") at attempt 1 of 3. A
terminated backend, a restarted or failed-over server, a network blip: Django raises
OperationalError or InterfaceError, and the connection it holds is dead; the next query on a
new connection works.

Contract of :func:`retried`: `work` is one transaction (or one statement) that is safe to run
again, because it is idempotent by its keys (a unique constraint answers a second insert, a
guarded UPDATE finds nothing to do). It is run again on a fresh connection up to
RETRY_TRIES times, waiting RETRY_FIRST_WAIT doubled each time (about 25 s in all). Inside an
outer transaction nothing is retried: that transaction is lost as a whole and only its owner
can run it again.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import TypeVar

from django.db import InterfaceError, OperationalError, connection

log = logging.getLogger(__name__)

TRANSIENT = (OperationalError, InterfaceError)
RETRY_TRIES = 8
RETRY_FIRST_WAIT = 0.1

T = TypeVar("T")


def retried(work: Callable[[], T], *, what: str, tries: int = RETRY_TRIES) -> T:
    """`work()`, run again on a new connection after a transient database error. A web
    request passes fewer `tries`: it must answer within seconds, and hands what is left to a
    worker."""
    for attempt in range(1, tries + 1):
        try:
            return work()
        except TRANSIENT as exc:
            if connection.in_atomic_block or attempt == tries:
                raise
            log.warning("%s: database error (%s: %s); reconnecting, try %d of %d", what,
                        type(exc).__name__, " ".join(str(exc).split())[:200], attempt + 1,
                        tries)
            with contextlib.suppress(*TRANSIENT):
                connection.close()  # dead: the next query opens a new one
            time.sleep(RETRY_FIRST_WAIT * 2 ** (attempt - 1))
    raise AssertionError("unreachable")  # the loop returns or raises
