"""The one exception type for rule violations; views turn it into a 4xx with its message. And
what a task queue that does not answer raises, which views word apart."""

from __future__ import annotations

QUEUE_DOWN = "The task queue (Redis) is not answering"


def queue_errors() -> tuple[type[BaseException], ...]:
    """What sending a task raises while the broker (Redis) does not answer."""
    from kombu.exceptions import OperationalError
    from redis.exceptions import RedisError

    return (OperationalError, RedisError, OSError)


class DomainError(Exception):
    """A rule of the domain said no. str(error) is a sentence fit for the user."""


class Forbidden(DomainError):
    """The person may not do this at all (a role, their own change): views answer 403."""


class WorkerNotAccepted(DomainError):
    """The web refuses this worker itself (an unknown or revoked token, another release): the
    worker must stop taking tasks, and what it held goes back to its queue."""
