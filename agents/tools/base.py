"""What every tool shares: the registry entry, the context a call runs in, its result, and the
errors a tool raises to answer the model with a structured error instead of failing the step.

A tool is one :class:`Tool` registered with :func:`tool`: its name, the description and JSON
schema the model reads, and the function that runs it. ``agents.tools`` collects them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reviews.diff_policy import Policy, Violation

if TYPE_CHECKING:
    from agents.models import AgentRun

MAX_RESULT_CHARS = 12_000


@dataclass(frozen=True)
class ToolResult:
    ok: bool
    content: str
    data: dict[str, Any]
    refusal: str | None = None


@dataclass
class Effects:
    """What a run tool asks of the run beyond its answer; the policy turns these into the
    step's outcome (services applies them), so no tool writes the run's lifecycle itself."""

    wait_for: int | None = None  # an experiment was queued: the run waits for it
    experiment: int | None = None  # the experiment this call requested or read
    finish: str | None = None  # the agent ended the run, with this summary
    submitted: int | None = None  # a change was submitted


@dataclass
class ToolContext:
    """Where a call runs. Workspace tools need only the worktree, the boundary and the base
    commit; run tools also need the run (``None`` in tests of the workspace alone)."""

    worktree: Path
    policy: Policy
    base_commit: str
    run: AgentRun | None = None
    effects: Effects = field(default_factory=Effects)


ToolFunction = Callable[[ToolContext, dict[str, Any]], ToolResult]


@dataclass(frozen=True)
class Tool:
    """One registry entry. ``untrusted``: the result carries repository or probe text, which
    the LLM policy wraps in untrusted markers. ``needs_run``: a run tool (database)."""

    name: str
    description: str
    parameters: dict[str, Any]
    function: ToolFunction
    untrusted: bool = False
    needs_run: bool = False

    @property
    def spec(self) -> dict[str, Any]:
        """The Chat Completions tool definition with the whole schema tool_call validates
        against (a request sends ``agents.tools.request_tools``, leaner)."""
        return {"type": "function", "function": {
            "name": self.name, "description": self.description, "parameters": self.parameters}}


REGISTRY: dict[str, Tool] = {}


def tool(name: str, description: str, parameters: dict[str, Any], *, untrusted: bool = False,
         needs_run: bool = False) -> Callable[[ToolFunction], ToolFunction]:
    """Register the decorated function as the tool ``name``."""

    def register(function: ToolFunction) -> ToolFunction:
        if name in REGISTRY:
            raise ValueError(f"tool {name!r} is registered twice")
        REGISTRY[name] = Tool(name, description, parameters, function, untrusted, needs_run)
        return function

    return register


# --------------------------------------------------------------------------- errors


class ArgumentError(Exception):
    """The arguments do not fit the schema (``field`` names where)."""

    def __init__(self, where: str, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.field = where
        self.message = message
        self.hint = hint


class ToolError(Exception):
    """The call cannot be done as asked; ``hint`` says what to do instead."""

    def __init__(self, message: str, hint: str) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class Refused(Exception):
    """The boundary refuses the call; nothing was written."""

    def __init__(self, violations: Sequence[Violation]) -> None:
        super().__init__("; ".join(str(v) for v in violations))
        self.violations = list(dict.fromkeys(violations))


def error_result(tool: str, message: str, hint: str, *, refusal: str | None = None,
                 **extra: Any) -> ToolResult:
    payload: dict[str, Any] = {"error": message, "tool": shorten(tool), "hint": hint, **extra}
    return ToolResult(ok=False, content=bounded(json.dumps(payload, ensure_ascii=False)),
                      data=payload, refusal=refusal)


def bounded(text: str, limit: int = MAX_RESULT_CHARS) -> str:
    if len(text) <= limit:
        return text
    note = f"\n[truncated: {len(text) - limit} more characters not shown]"
    return text[: limit - len(note)] + note


def shorten(text: str, limit: int = 100) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
