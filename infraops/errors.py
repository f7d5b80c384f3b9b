"""The one exception type for rule violations; views turn it into a 4xx with its message."""

from __future__ import annotations


class DomainError(Exception):
    """A rule of the domain said no. str(error) is a sentence fit for the user."""


class Forbidden(DomainError):
    """The person may not do this at all (a role, their own change): views answer 403."""
