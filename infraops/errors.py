"""The one exception type for rule violations; views turn it into a 4xx with its message."""

from __future__ import annotations


class DomainError(Exception):
    """A rule of the domain said no. str(error) is a sentence fit for the user."""


class Forbidden(DomainError):
    """The person may not do this at all (a role, their own change): views answer 403."""


class WorkerNotAccepted(DomainError):
    """The web refuses this worker itself (an unknown or revoked token, another release): the
    worker must stop taking tasks, and what it held goes back to its queue."""
