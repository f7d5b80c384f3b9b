"""The agent's tools: one registry, one entry point.

Each tool is one entry (name, description, JSON schema, function) registered with
``agents.tools.base.tool`` in the module of its job:

- ``agents.tools.schema``: the schema builders and the validation of the model's arguments;
- ``agents.tools.workspace``: the run's git worktree under the boundary (no Django model), a
  package with one module per tool family, imported in this order: ``reading`` (list_files,
  read_file), ``search`` (search_code), ``editing`` (edit_file, apply_diff), ``changes``
  (show_diff, revert); and the helpers they share: ``worktree`` (paths, files), ``diffs``
  (the run's diff and its cap), ``guard`` (a write checked as git wrote it), ``journal`` (the
  undo journal), ``syntax`` (the syntax check);
- ``agents.tools.run``: the run's experiments, hypotheses, change and end (database);
- ``agents.tools.experiments``: reading the run's experiments closer (a crash's stderr, the
  probes and their cost, two experiments side by side, a case's numbers, a span's timing);
- tools of apps above this one, registered from their app config when Django starts
  (``skeletons.tools``: the techniques of the skeleton library that fit a probe, and recording
  that the run applies one).

Every call goes through :func:`tool_call`, which parses and validates the arguments against
the entry's schema before anything runs.

Contracts:

* A result's ``content`` (what the model reads) is at most ``MAX_RESULT_CHARS`` characters and
  says when it was cut. An error's content is a JSON object ``{"error", "tool", "hint"}`` (plus
  ``field`` for argument errors and ``violations`` for refusals); ``data`` holds the same
  object for storage.
* A refusal by the boundary sets ``refusal`` to the reasons (shown on the run page) and leaves
  the worktree exactly as it was.
* Nothing the model sends raises: unknown tools, bad arguments, refusals, git failures and a
  run tool's DomainError come back as structured errors.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from agents.tools import experiments as _experiment_tools  # noqa: F401  (registers them)
from agents.tools import run as _run_tools  # noqa: F401  (registers the run tools)
from agents.tools import workspace as _workspace_tools  # noqa: F401  (registers them)
from agents.tools.base import (
    MAX_RESULT_CHARS,
    REGISTRY,
    ArgumentError,
    Effects,
    Refused,
    Tool,
    ToolContext,
    ToolError,
    ToolResult,
    bounded,
    error_result,
)
from agents.tools.schema import lean, parse_arguments, schema_hint, validate
from infraops import gitops
from infraops.errors import DomainError

__all__ = ["MAX_RESULT_CHARS", "REGISTRY", "Effects", "Tool", "ToolContext", "ToolResult",
           "request_tools", "tool_call", "tool_specs"]


def tool_specs() -> list[dict[str, Any]]:
    """Every registered tool's definition, as a request sends them. Read at call time: apps
    above this one register their tools when Django starts, after this module is imported."""
    return [entry.spec for entry in REGISTRY.values()]


def request_tools() -> list[dict[str, Any]]:
    """The tool definitions one request sends: each tool's one line and its schema without
    what only the validation needs (``schema.lean``; a tool without arguments sends no
    parameters). At most 5 KB on the wire for the whole set (tests/agents/test_tools.py)."""
    definitions = []
    for entry in REGISTRY.values():
        function: dict[str, Any] = {"name": entry.name, "description": entry.description}
        if entry.parameters.get("properties"):
            function["parameters"] = lean(entry.parameters)
        definitions.append({"type": "function", "function": function})
    return definitions


def tool_call(ctx: ToolContext, name: str, arguments: str) -> ToolResult:
    """Validate ``arguments`` (the model's JSON text) for tool ``name`` and run it.

    Never raises for anything the model sent. An exception other than the tools' own errors,
    DomainError and GitError propagates to the caller (a bug, not a bad call)."""
    entry = REGISTRY.get(name)
    if entry is None:
        names = list(REGISTRY)
        return error_result(name, f"unknown tool {name[:100]!r}",
                            f"Call one of: {', '.join(names)}.", tools=names)
    try:
        args = validate(entry.parameters, parse_arguments(arguments), "")
    except ArgumentError as exc:
        hint = exc.hint or schema_hint(entry.parameters)
        return error_result(name, exc.message, hint,
                            **({"field": exc.field} if exc.field else {}))
    if entry.needs_run and ctx.run is None:
        return error_result(name, f"tool {name!r} is not available here (it needs a run)",
                            "Use the workspace tools.")
    root = str(ctx.worktree.resolve())
    try:
        result = entry.function(ctx, args)
    except Refused as exc:
        reasons = [str(v) for v in exc.violations]
        refusal = "; ".join(reasons)
        return error_result(name, f"refused by the run's boundaries: {refusal}",
                            "The boundaries are fixed for this run; nothing was changed. Work "
                            "inside them.", refusal=refusal, violations=reasons)
    except ArgumentError as exc:
        return error_result(name, exc.message, exc.hint or "Check the arguments.",
                            field=exc.field)
    except ToolError as exc:
        return error_result(name, exc.message.replace(root, "."), exc.hint)
    except gitops.GitError as exc:
        # Host paths mean nothing to the model; the worktree is its '.'.
        return error_result(name, str(exc).replace(root, "."),
                            "Check the arguments and try again.")
    except DomainError as exc:
        return error_result(name, str(exc).replace(root, "."),
                            "Read the error, then change the arguments or the plan.")
    return dataclasses.replace(result, content=bounded(result.content))
