"""The classifier's data: a ``Finding`` per risky line, a ``Rule`` per thing that finds them."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

MAX_TEXT = 300


@dataclass(frozen=True)
class Finding:
    """One risky line (``line`` None: the whole file) and why a reviewer should look at it.

    ``line`` is the new file's line number, the old file's for a removed line; ``text`` is the
    line as the diff shows it (at most 300 characters), "" for a whole-file finding; ``side``
    is "added", "removed", "context" or "file"; ``context`` names the enclosing function,
    kernel or critical section when the classifier knows it.
    """

    category: str
    rule: str
    reason: str
    path: str
    line: int | None
    text: str
    side: str = "file"
    context: str = ""

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field."""
        return asdict(self)


@dataclass(frozen=True)
class Rule:
    """A rule the classifier applies. A built-in rule (``builtin``) names one family of the
    built-in analysers' findings (its ``reason`` describes the family; each finding has its
    own); a target's rule flags changed lines matching ``patterns`` (regular expressions,
    applied as written) and every changed line of files matching ``paths`` (globs)."""

    name: str
    category: str
    reason: str
    paths: tuple[str, ...] = ()
    patterns: tuple[str, ...] = ()
    builtin: bool = False
