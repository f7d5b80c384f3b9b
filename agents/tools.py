"""The agent's tools: JSON schemas, argument validation, boundaries, structured errors.

Every tool call goes through :func:`tool_call`, which parses and validates the model's
arguments against the tool's schema before anything runs. The workspace tools (list, read,
search, edit, apply a diff) work on the run's git worktree and enforce the boundary of
ARCHITECTURE.md ("Git") through ``reviews.diff_policy``; the tools that touch the database
(experiments, hypotheses, changes, finishing) are callbacks the caller provides, so this
module imports no Django model and is testable on a plain temporary git worktree.

Contracts:

* A result's ``content`` (what the model reads) is at most ``MAX_RESULT_CHARS`` characters
  and says when it was cut. An error's content is a JSON object
  ``{"error", "tool", "hint"}`` (plus ``field`` for argument errors and ``violations`` for
  refusals); ``data`` holds the same object for storage.
* A refusal by the boundary sets ``refusal`` to the reasons (shown on the run page) and
  leaves the worktree exactly as it was.
* File contents come back verbatim as data: nothing read from the repository is ever
  interpreted here. Marking it as untrusted for the model is the LLM policy's job.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import importlib
import json
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from types import FrameType
from typing import Any

from unidiff.errors import UnidiffParseError
from unidiff.patch import PatchSet

from infraops import gitops
from infraops.errors import DomainError
from infraops.manifest import glob_match
from reviews.diff_policy import (
    EXECUTABLE_MODE,
    Policy,
    Violation,
    case_collisions,
    check_diff,
    path_violations,
)

MAX_RESULT_CHARS = 12_000
MAX_ARGUMENT_BYTES = 1_000_000
MAX_LIST_ENTRIES = 500
DEFAULT_READ_LINES = 400
MAX_READ_BYTES = 10_000_000
MAX_LINE_CHARS = 2_000
MAX_PATTERN_CHARS = 200
SEARCH_MAX_FILES = 5_000
SEARCH_MAX_BYTES = 20_000_000
SEARCH_MAX_FILE_BYTES = 1_000_000
SEARCH_MAX_MATCHES = 200
SEARCH_LINE_CHARS = 1_000
SEARCH_SECONDS = 5.0
_SHOWN_MATCH_CHARS = 300
_BINARY_SNIFF_BYTES = 8_000

CALLBACK_TOOLS = ("run_experiment", "inspect_experiment", "record_hypothesis",
                  "switch_hypothesis", "submit_change", "finish")


@dataclass(frozen=True)
class ToolResult:
    ok: bool
    content: str
    data: dict[str, Any]
    refusal: str | None = None


@dataclass
class ToolContext:
    worktree: Path
    policy: Policy
    base_commit: str
    callbacks: Mapping[str, Callable[[dict[str, Any]], ToolResult]] = field(default_factory=dict)


# --------------------------------------------------------------------------- schemas


def _string(description: str, max_length: int, **extra: Any) -> dict[str, Any]:
    return {"type": "string", "description": description, "maxLength": max_length, **extra}


def _integer(description: str, minimum: int, maximum: int, **extra: Any) -> dict[str, Any]:
    return {"type": "integer", "description": description, "minimum": minimum,
            "maximum": maximum, **extra}


def _object(properties: dict[str, Any], required: Sequence[str] = ()) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(required),
            "additionalProperties": False}


_MAX_ID = 2**63 - 1
_MAX_LINE = 100_000_000
_PATH = _string("Repository-relative path, '/'-separated.", 1_000, minLength=1)

_TOOLS: dict[str, tuple[str, dict[str, Any]]] = {
    "list_files": (
        "List the repository's files (tracked and new, not ignored; never .git) under a folder, "
        f"filtered by a glob relative to that folder ('**' any depth). At most "
        f"{MAX_LIST_ENTRIES} entries.",
        _object({
            "path": _string("Folder to list, repository-relative; '' for the root.", 1_000,
                            default=""),
            "glob": _string("Glob relative to `path`, e.g. '**/*.py'.", 200, default="**"),
        }),
    ),
    "read_file": (
        "Read a text file's lines with line numbers (default: 400 lines from start_line). "
        "Long output is cut; the result says where to continue.",
        _object({
            "path": _PATH,
            "start_line": _integer("First line, 1-based.", 1, _MAX_LINE, default=1),
            "end_line": _integer("Last line, inclusive (default start_line + 399).", 1,
                                 _MAX_LINE),
        }, required=["path"]),
    ),
    "search_code": (
        "Search the repository's text files with a Python regular expression (at most "
        f"{MAX_PATTERN_CHARS} characters; no backreferences, no quantifier or alternation "
        "inside a repeated group). Returns 'path:line: text' for each match, at most "
        f"{SEARCH_MAX_MATCHES}.",
        _object({
            "pattern": _string("Regular expression (Python syntax).", MAX_PATTERN_CHARS,
                               minLength=1),
            "path_glob": _string("Only files whose repository-relative path matches this "
                                 "glob, e.g. 'src/**/*.py'.", 200, default="**"),
            "ignore_case": {"type": "boolean", "description": "Case-insensitive match.",
                            "default": False},
        }, required=["pattern"]),
    ),
    "edit_file": (
        "Replace the one exact occurrence of old_text with new_text in a file. With old_text "
        "'' a new file is created. Edits must stay inside the editable paths, off protected "
        "paths, free of forbidden patterns and within the run's diff-size cap; a refused edit "
        "writes nothing and says why.",
        _object({
            "path": _PATH,
            "old_text": _string("Exact text to replace; it must occur exactly once. '' to "
                                "create a new file.", 200_000),
            "new_text": _string("Replacement text.", 200_000),
        }, required=["path", "old_text", "new_text"]),
    ),
    "apply_diff": (
        "Apply a unified diff (git style, a/ and b/ prefixes) to the worktree. It is checked "
        "against the run's boundaries first and applied all or nothing; no symlinks, binary "
        "patches, renames or copies.",
        _object({"diff": _string("The unified diff.", 500_000, minLength=1)},
                required=["diff"]),
    ),
    "run_experiment": (
        "Run the current worktree against the base commit. Without `probes`, the probes "
        "covering the changed files run. Returns the experiment's id and, when done, its "
        "feedback.",
        _object({
            "probes": {"type": "array", "description": "Probe names from infraops.toml.",
                       "items": _string("A probe name.", 200, minLength=1), "maxItems": 50},
            "reason": _string("What this experiment should tell you.", 2_000, minLength=1),
        }, required=["reason"]),
    ),
    "inspect_experiment": (
        "Show an experiment's status, results and feedback.",
        _object({"experiment_id": _integer("The experiment's id.", 1, _MAX_ID)},
                required=["experiment_id"]),
    ),
    "record_hypothesis": (
        "Record a hypothesis in the run's ledger, or update one (give hypothesis_id).",
        _object({
            "title": _string("One line.", 200, minLength=1),
            "rationale": _string("Why you believe it, and how you will test it.", 4_000,
                                 minLength=1),
            "status": {"type": "string", "enum": ["open", "confirmed", "refuted", "abandoned"],
                       "description": "Where the hypothesis stands."},
            "hypothesis_id": _integer("The hypothesis to update; omit to record a new one.",
                                      1, _MAX_ID),
        }, required=["title", "rationale", "status"]),
    ),
    "switch_hypothesis": (
        "Work on a hypothesis's own git branch. Your current edits are committed on the branch "
        "you are on; the worktree then holds the hypothesis's branch (made from the base commit "
        "the first time), so the edits and experiments of different hypotheses never mix.",
        _object({"hypothesis_id": _integer("The ledger id from record_hypothesis.", 1, _MAX_ID)},
                required=["hypothesis_id"]),
    ),
    "submit_change": (
        "Submit the worktree's diff for review with the hypothesis it tests and the "
        "experiment that is its evidence.",
        _object({
            "title": _string("One line.", 200, minLength=1),
            "hypothesis": _string("What the change does and why it helps.", 4_000, minLength=1),
            "experiment_id": _integer("The experiment run on exactly this diff.", 1, _MAX_ID),
        }, required=["title", "hypothesis", "experiment_id"]),
    ),
    "finish": (
        "End the run with a summary of what was tried, learned and submitted.",
        _object({"summary": _string("The summary.", 4_000, minLength=1)}, required=["summary"]),
    ),
}

TOOL_SPECS: list[dict[str, Any]] = [
    {"type": "function",
     "function": {"name": name, "description": description, "parameters": parameters}}
    for name, (description, parameters) in _TOOLS.items()
]


# --------------------------------------------------------------------------- entry point


class _ArgumentError(Exception):
    def __init__(self, where: str, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.field = where
        self.message = message
        self.hint = hint


class _ToolError(Exception):
    def __init__(self, message: str, hint: str) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class _Refused(Exception):
    def __init__(self, violations: Sequence[Violation]) -> None:
        super().__init__("; ".join(str(v) for v in violations))
        self.violations = list(dict.fromkeys(violations))


def tool_call(ctx: ToolContext, name: str, arguments: str) -> ToolResult:
    """Validate ``arguments`` (the model's JSON text) for tool ``name`` and run it.

    Never raises for anything the model sent: unknown tools, bad arguments, refusals and
    git failures come back as structured errors. A callback's DomainError becomes a
    structured error too; any other exception from a callback propagates to the caller.
    """
    entry = _TOOLS.get(name)
    if entry is None:
        names = list(_TOOLS)
        return _error(name, f"unknown tool {_shorten(name)!r}",
                      f"Call one of: {', '.join(names)}.", tools=names)
    parameters = entry[1]
    try:
        args = _validate(parameters, _parse_arguments(arguments), "")
    except _ArgumentError as exc:
        hint = exc.hint or _schema_hint(parameters)
        return _error(name, exc.message, hint, **({"field": exc.field} if exc.field else {}))
    local = _LOCAL_TOOLS.get(name)
    if local is not None:
        return _run_local(ctx, name, local, args)
    callback = ctx.callbacks.get(name)
    if callback is None:
        return _error(name, f"tool {name!r} is not available in this run",
                      f"Available here: {', '.join([*_LOCAL_TOOLS, *ctx.callbacks])}.")
    try:
        result = callback(args)
    except DomainError as exc:
        return _error(name, str(exc), "Read the error, then change the arguments or the plan.")
    return dataclasses.replace(result, content=_bounded(result.content))


def _run_local(ctx: ToolContext, name: str,
               run: Callable[[ToolContext, dict[str, Any]], ToolResult],
               args: dict[str, Any]) -> ToolResult:
    root = str(ctx.worktree.resolve())
    try:
        return run(ctx, args)
    except _Refused as exc:
        reasons = [str(v) for v in exc.violations]
        refusal = "; ".join(reasons)
        return _error(name, f"refused by the run's boundaries: {refusal}",
                      "The boundaries are fixed for this run; nothing was changed. Work "
                      "inside them.", refusal=refusal, violations=reasons)
    except _ArgumentError as exc:
        return _error(name, exc.message, exc.hint or "Check the arguments.", field=exc.field)
    except _ToolError as exc:
        return _error(name, exc.message.replace(root, "."), exc.hint)
    except gitops.GitError as exc:
        # Host paths mean nothing to the model; the worktree is its '.'.
        return _error(name, str(exc).replace(root, "."), "Check the arguments and try again.")


def _error(tool: str, message: str, hint: str, *, refusal: str | None = None,
           **extra: Any) -> ToolResult:
    payload: dict[str, Any] = {"error": message, "tool": _shorten(tool), "hint": hint, **extra}
    return ToolResult(ok=False, content=_bounded(json.dumps(payload, ensure_ascii=False)),
                      data=payload, refusal=refusal)


def _bounded(text: str, limit: int = MAX_RESULT_CHARS) -> str:
    if len(text) <= limit:
        return text
    note = f"\n[truncated: {len(text) - limit} more characters not shown]"
    return text[: limit - len(note)] + note


def _shorten(text: str, limit: int = 100) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


# --------------------------------------------------------------------------- validation


def _parse_arguments(arguments: str) -> dict[str, Any]:
    """The arguments as a dict; _ArgumentError when too large, not JSON or not an object."""
    # len() of a str is O(1) and a character is at least one byte, so a 10 MB string is
    # refused here without being encoded or parsed.
    if len(arguments) > MAX_ARGUMENT_BYTES or (
        len(arguments) * 4 > MAX_ARGUMENT_BYTES
        and len(arguments.encode("utf-8", "surrogatepass")) > MAX_ARGUMENT_BYTES
    ):
        raise _ArgumentError("", f"arguments too large (over {MAX_ARGUMENT_BYTES} bytes of "
                                 "JSON)")
    if not arguments.strip():
        return {}
    try:
        value = json.loads(arguments, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise _ArgumentError("", f"arguments are not valid JSON: {exc.msg} at character "
                                 f"{exc.pos}") from None
    except (ValueError, RecursionError) as exc:
        raise _ArgumentError("", f"arguments are not valid JSON: {_shorten(str(exc))}") from None
    if not isinstance(value, dict):
        raise _ArgumentError("", f"arguments must be a JSON object, not {_json_type(value)}")
    return value


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def _validate(schema: Mapping[str, Any], value: Any, where: str) -> Any:
    """``value`` checked against ``schema`` (the subset of JSON Schema used above), with
    defaults filled in for absent object properties; _ArgumentError names the field."""
    kind = schema["type"]
    label = f"`{where}`" if where else "arguments"
    if not _has_type(value, kind):
        raise _ArgumentError(where, f"{label} must be {_article(kind)}, not "
                                    f"{_json_type(value)}")
    if kind == "object":
        return _validate_object(schema, value, where)
    if kind == "array":
        if len(value) > schema.get("maxItems", len(value)):
            raise _ArgumentError(where, f"{label} has {len(value)} items; at most "
                                        f"{schema['maxItems']} allowed")
        return [_validate(schema["items"], item, f"{where}[{i}]") for i, item in enumerate(value)]
    if kind == "string":
        _check_string(schema, value, where, label)
    low, high = schema.get("minimum", value), schema.get("maximum", value)
    if kind == "integer" and not low <= value <= high:
        raise _ArgumentError(where, f"{label} must be between {low} and {high}, not {value}")
    if "enum" in schema and value not in schema["enum"]:
        raise _ArgumentError(where, f"{label} must be one of {', '.join(map(str, schema['enum']))}"
                                    f"; got {_shorten(repr(value))}")
    return value


def _has_type(value: Any, kind: str) -> bool:
    expected = {"object": dict, "array": list, "string": str, "boolean": bool, "integer": int}
    # bool is an int in Python, but true is not an integer in JSON.
    return isinstance(value, expected[kind]) and not (kind == "integer"
                                                      and isinstance(value, bool))


def _validate_object(schema: Mapping[str, Any], value: dict[str, Any],
                     where: str) -> dict[str, Any]:
    properties: dict[str, Any] = schema.get("properties", {})
    prefix = f"{where}." if where else ""
    if schema.get("additionalProperties", True) is False:
        unknown = sorted(set(value) - set(properties))
        if unknown:
            name = _shorten(unknown[0])
            raise _ArgumentError(prefix + name, f"unknown field `{prefix}{name}`; allowed: "
                                                f"{', '.join(properties) or 'none'}")
    for key in schema.get("required", ()):
        if key not in value:
            raise _ArgumentError(prefix + key, f"missing required field `{prefix}{key}`")
    checked: dict[str, Any] = {}
    for key, sub in properties.items():
        if key in value:
            checked[key] = _validate(sub, value[key], prefix + key)
        elif "default" in sub:
            checked[key] = sub["default"]
    return checked


def _check_string(schema: Mapping[str, Any], value: str, where: str, label: str) -> None:
    if len(value) > schema.get("maxLength", len(value)):
        raise _ArgumentError(where, f"{label} is too long: {len(value)} characters, at most "
                                    f"{schema['maxLength']}")
    if len(value) < schema.get("minLength", 0):
        raise _ArgumentError(where, f"{label} must not be empty")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise _ArgumentError(where, f"{label} is not valid Unicode text (a lone surrogate)"
                             ) from None


def _json_type(value: Any) -> str:
    names = [(bool, "a boolean"), (int, "an integer"), (float, "a number"), (str, "a string"),
             (list, "an array"), (dict, "an object")]
    return next((name for kind, name in names if isinstance(value, kind)), "null")


def _article(kind: str) -> str:
    return f"an {kind}" if kind[0] in "aeiou" else f"a {kind}"


def _schema_hint(parameters: Mapping[str, Any]) -> str:
    fields = []
    for key, sub in parameters["properties"].items():
        optional = "" if key in parameters["required"] else ", optional"
        fields.append(f"{key} ({sub['type']}{optional})")
    return f"Send a JSON object with: {'; '.join(fields)}. No other fields."


# --------------------------------------------------------------------------- paths


def _resolve(ctx: ToolContext, path: str, *, write: bool) -> tuple[str, Path]:
    """(normalised repository-relative path, absolute path) of ``path`` in the worktree.

    _Refused when it leaves the worktree (absolute, '..', a symlink resolving outside),
    names .git, or, for a write, goes through any symlink (a write through a link would
    change a file the boundary check never saw).
    """
    root = ctx.worktree.resolve()
    if any(ch in path for ch in "\0\n\r"):
        raise _ToolError(f"path {_shorten(path)!r} contains control characters",
                         "Give a plain repository-relative path.")
    pure = PurePosixPath(path)
    if pure.is_absolute() or ".." in pure.parts:
        raise _Refused([Violation(_shorten(path), "leaves the repository")])
    parts = [part for part in pure.parts if part != "."]
    rel = "/".join(parts)
    if ".git" in parts:
        raise _Refused([Violation(rel, "is inside .git")])
    full = root.joinpath(*parts)
    try:
        inner = full.resolve().relative_to(root).parts
    except ValueError:
        raise _Refused([Violation(rel, "resolves outside the repository (symlink)")]) from None
    except (RuntimeError, OSError):
        raise _Refused([Violation(rel, "cannot be resolved (symlink loop)")]) from None
    if ".git" in inner:
        raise _Refused([Violation(rel, "resolves into .git (symlink)")])
    if write:
        link = _first_symlink(root, parts)
        if link is not None:
            raise _Refused([Violation(rel, f"goes through the symlink {link}; symlinks are "
                                           "never written through")])
    return rel, full


def _first_symlink(root: Path, parts: Sequence[str]) -> str | None:
    probe = root
    for part in parts:
        probe = probe / part
        if probe.is_symlink():
            return probe.relative_to(root).as_posix()
    return None


def _escaping_symlinks(root: Path, paths: Sequence[str]) -> list[Violation]:
    """Symlinks on ``paths`` (or their folders) that point outside the repository."""
    found: list[Violation] = []
    for path in paths:
        probe = root
        for part in PurePosixPath(path).parts:
            probe = probe / part
            if probe.is_symlink() and not probe.resolve().is_relative_to(root):
                found.append(Violation(probe.relative_to(root).as_posix(),
                                       "is a symlink leaving the repository"))
    return found


def _repo_files(root: Path) -> list[str]:
    """Repository-relative files present in the worktree: tracked and untracked, minus
    ignored ones (what ``git add --all`` would see); never anything under .git."""
    output = gitops.git(root, "ls-files", "--cached", "--others", "--exclude-standard", "-z")
    names = dict.fromkeys(name for name in output.split("\0") if name)
    return sorted(name for name in names if (root / name).is_symlink() or (root / name).exists())


def _untracked(root: Path) -> list[str]:
    output = gitops.git(root, "ls-files", "--others", "--exclude-standard", "-z")
    return [name for name in output.split("\0") if name]


def _is_binary(raw: bytes) -> bool:
    # git's own test: a NUL byte near the start.
    return b"\0" in raw[:_BINARY_SNIFF_BYTES]


# --------------------------------------------------------------------------- reading tools


def _list_files(ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
    rel, full = _resolve(ctx, args["path"], write=False)
    if rel and not full.is_dir():
        raise _ToolError(f"{rel} is not a folder", "Use read_file for a file; list_files "
                                                   "with path '' lists the whole repository.")
    root = ctx.worktree.resolve()
    prefix = f"{rel}/" if rel else ""
    chosen = [name for name in _repo_files(root)
              if name.startswith(prefix) and glob_match(args["glob"], name[len(prefix):])]
    shown = chosen[:MAX_LIST_ENTRIES]
    lines = [f"{name} (symlink)" if (root / name).is_symlink() else name for name in shown]
    if len(chosen) > len(shown):
        lines.append(f"... and {len(chosen) - len(shown)} more (narrow `path` or `glob`)")
    header = f"{len(chosen)} files under {rel or '.'} matching {args['glob']!r}:"
    return ToolResult(True, _bounded("\n".join([header, *lines])),
                      {"path": rel, "glob": args["glob"], "count": len(chosen),
                       "shown": len(shown)})


def _read_file(ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
    rel, full = _resolve(ctx, args["path"], write=False)
    raw = _read_text_bytes(rel, full)
    start = args["start_line"]
    end = args.get("end_line", start + DEFAULT_READ_LINES - 1)
    if end < start:
        raise _ToolError(f"end_line {end} is before start_line {start}",
                         "Give end_line >= start_line.")
    lines = raw.decode("utf-8", "replace").split("\n")
    if lines[-1] == "":
        lines.pop()
    total = len(lines)
    if total and start > total:
        raise _ToolError(f"start_line {start} is past the end of {rel} ({total} lines)",
                         f"Read from a line between 1 and {total}.")
    body, last = _numbered(lines, start, min(end, total))
    header = f"{rel}, lines {start}-{last} of {total}:" if total else f"{rel} is empty."
    if last < min(end, total):
        body.append(f"[cut at line {last} to stay within {MAX_RESULT_CHARS} characters; "
                    f"continue with start_line={last + 1}]")
    return ToolResult(True, _bounded("\n".join([header, *body])),
                      {"path": rel, "start_line": start, "end_line": last,
                       "total_lines": total})


def _read_text_bytes(rel: str, full: Path) -> bytes:
    if full.is_dir():
        raise _ToolError(f"{rel} is a folder", "Use list_files to see what it contains.")
    if not full.is_file():
        raise _ToolError(f"{rel} does not exist", "Use list_files or search_code to find files.")
    size = full.stat().st_size
    if size > MAX_READ_BYTES:
        raise _ToolError(f"{rel} is too large to read ({size} bytes)",
                         "Use search_code to find the part you need.")
    raw = full.read_bytes()
    if _is_binary(raw):
        raise _ToolError(f"{rel} is a binary file ({size} bytes)",
                         "Binary files cannot be read or edited as text.")
    return raw


def _numbered(lines: Sequence[str], start: int, end: int) -> tuple[list[str], int]:
    """Numbered lines start..end that fit in the result budget, and the last one shown."""
    budget = MAX_RESULT_CHARS - 400
    out: list[str] = []
    last = start - 1
    for number in range(start, end + 1):
        text = lines[number - 1]
        if len(text) > MAX_LINE_CHARS:
            text = text[:MAX_LINE_CHARS] + f" [line cut: {len(text)} characters]"
        row = f"{number:6}\t{text}"
        budget -= len(row) + 1
        if budget < 0 and out:
            break
        out.append(row)
        last = number
    return out, last


def _search_code(ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
    pattern = _compile_pattern(args["pattern"], ignore_case=args["ignore_case"])
    root = ctx.worktree.resolve()
    files = [name for name in _repo_files(root) if glob_match(args["path_glob"], name)]
    scan = _Scan()
    try:
        with _time_limit(SEARCH_SECONDS):
            scan.run(root, files, pattern)
    except _SearchTimeout:
        scan.notes.append(f"[stopped after {SEARCH_SECONDS:g} s; narrow the pattern or "
                          "path_glob]")
    lines = [f"{path}:{number}: {text}" for path, number, text in scan.matches]
    header = (f"{len(scan.matches)} matches for {args['pattern']!r} in {scan.searched} files"
              f"{' (stopped early)' if scan.notes else ''}:")
    return ToolResult(True, _bounded("\n".join([header, *lines, *scan.notes])),
                      {"pattern": args["pattern"], "matches": len(scan.matches),
                       "files_searched": scan.searched, "notes": scan.notes})


@dataclass
class _Scan:
    matches: list[tuple[str, int, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    searched: int = 0
    bytes_read: int = 0

    def run(self, root: Path, files: Sequence[str], pattern: re.Pattern[str]) -> None:
        deadline = time.monotonic() + SEARCH_SECONDS
        skipped = 0
        for name in files:
            if self._stop(deadline, len(files)):
                return
            full = root / name
            if full.is_symlink() or not full.is_file():
                continue
            if full.stat().st_size > SEARCH_MAX_FILE_BYTES:
                skipped += 1
                continue
            raw = full.read_bytes()
            self.bytes_read += len(raw)
            self.searched += 1
            if not _is_binary(raw):
                self._scan_file(name, raw.decode("utf-8", "replace"), pattern)
        if skipped:
            self.notes.append(f"[{skipped} files over {SEARCH_MAX_FILE_BYTES} bytes not searched]")

    def _stop(self, deadline: float, total: int) -> bool:
        reason = None
        if len(self.matches) >= SEARCH_MAX_MATCHES:
            reason = f"stopped at {SEARCH_MAX_MATCHES} matches; narrow the pattern or path_glob"
        elif self.searched >= SEARCH_MAX_FILES or self.bytes_read >= SEARCH_MAX_BYTES:
            reason = (f"stopped after {self.searched} of {total} files "
                      f"({self.bytes_read} bytes); narrow path_glob")
        elif time.monotonic() > deadline:
            reason = f"stopped after {SEARCH_SECONDS:g} s; narrow the pattern or path_glob"
        if reason:
            self.notes.append(f"[{reason}]")
        return reason is not None

    def _scan_file(self, name: str, text: str, pattern: re.Pattern[str]) -> None:
        for number, line in enumerate(text.split("\n"), start=1):
            if pattern.search(line[:SEARCH_LINE_CHARS]):
                self.matches.append((name, number, line.strip()[:_SHOWN_MATCH_CHARS]))
                if len(self.matches) >= SEARCH_MAX_MATCHES:
                    return


# re._parser is private but stable from 3.11 on; sre_parse, its public alias, warns on import.
_sre: Any = importlib.import_module("re._parser")
_REPEATS = frozenset({_sre.MAX_REPEAT, _sre.MIN_REPEAT, _sre.POSSESSIVE_REPEAT})


def _compile_pattern(pattern: str, *, ignore_case: bool) -> re.Pattern[str]:
    """The compiled pattern; _ArgumentError naming `pattern` when it is invalid or can
    backtrack catastrophically (exponential time on one line)."""
    flags = re.IGNORECASE if ignore_case else 0
    try:
        compiled = re.compile(pattern, flags)
        problem = _backtracking_problem(_sre.parse(pattern, flags), repeated=False)
    except (re.error, RecursionError, OverflowError) as exc:
        raise _ArgumentError("pattern", f"`pattern` is not a valid regular expression: {exc}",
                             "Fix the pattern (Python re syntax).") from None
    if problem:
        raise _ArgumentError("pattern", f"`pattern` is refused: {problem}",
                             "Simplify the pattern: no backreferences, and no quantifier or "
                             "'|' inside a group that is itself repeated.")
    return compiled


def _backtracking_problem(items: Any, *, repeated: bool) -> str | None:
    """Why the parsed pattern may backtrack exponentially, or None.

    Exponential blow-ups need a repeated group that can match the same text in several
    ways: a quantifier or an alternation inside a repeat, or a backreference. Refusing
    those keeps matching polynomial; the time limit in _time_limit bounds the rest.
    """
    for op, av in items:
        if op in (_sre.GROUPREF, _sre.GROUPREF_EXISTS):
            return "backreferences are not supported"
        if op in _REPEATS:
            if repeated:
                return "a quantifier inside a repeated group (catastrophic backtracking)"
            problem = _backtracking_problem(av[2], repeated=av[1] > 1)
        elif op == _sre.BRANCH and repeated:
            return "an alternation inside a repeated group (catastrophic backtracking)"
        else:
            problem = _nested_problem(av, repeated=repeated)
        if problem:
            return problem
    return None


def _nested_problem(av: Any, *, repeated: bool) -> str | None:
    if isinstance(av, _sre.SubPattern):
        return _backtracking_problem(av, repeated=repeated)
    if isinstance(av, (tuple, list)):
        for part in av:
            problem = _nested_problem(part, repeated=repeated)
            if problem:
                return problem
    return None


class _SearchTimeout(Exception):
    pass


@contextlib.contextmanager
def _time_limit(seconds: float) -> Iterator[None]:
    """Raise _SearchTimeout in the body after ``seconds``.

    CPython's regex engine checks for signals while it backtracks, so SIGALRM interrupts
    a single runaway match (measured: `.*a.*a.*b` on one 1000-character line ran 30 s
    unguarded, 0.5 s with a 0.5 s alarm). Signals reach only the main thread (where Celery's
    prefork workers run tasks); elsewhere the body runs unguarded, bounded by the pattern
    checks and per-line caps. An outer timer (pytest-timeout's) is restored afterwards.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    armed = True

    def on_alarm(signum: int, frame: FrameType | None) -> None:
        # Disarmed first thing on the way out: an alarm landing while the old handler is
        # being restored must not raise out of the finally block and skip the restore.
        if armed:
            raise _SearchTimeout

    previous_handler = signal.signal(signal.SIGALRM, on_alarm)
    previous_delay, previous_interval = signal.setitimer(signal.ITIMER_REAL, seconds)
    if 0 < previous_delay < seconds:
        signal.setitimer(signal.ITIMER_REAL, previous_delay)
    started = time.monotonic()
    try:
        yield
    finally:
        armed = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM,
                      previous_handler if previous_handler is not None else signal.SIG_DFL)
        if previous_delay:
            left = previous_delay - (time.monotonic() - started)
            signal.setitimer(signal.ITIMER_REAL, max(left, 0.001), previous_interval)


# --------------------------------------------------------------------------- writing tools


def _edit_file(ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
    """Exact replacement, checked before anything is written: the path against the
    boundary, the edit's own diff for forbidden patterns, and the run's whole diff (the
    worktree against base_commit, this file as it would be after the edit) for the cap."""
    path_problems = path_violations(args["path"], ctx.policy)
    if path_problems:
        raise _Refused(path_problems)
    rel, full = _resolve(ctx, args["path"], write=True)
    current = _current_text(rel, full)
    new = _replaced(rel, current, args["old_text"], args["new_text"])
    edit_diff = _file_diff(rel, current, new)
    uncapped = dataclasses.replace(ctx.policy, max_diff_lines=sys.maxsize)
    root = ctx.worktree.resolve()
    violations = check_diff(edit_diff, uncapped, existing=_repo_files(root))
    others = _worktree_diff(ctx, root, without=rel)
    base = _base_text(ctx, root, rel)
    before = others + _file_diff(rel, base, current)
    after = others + _file_diff(rel, base, new)
    violations += _cap_violations(ctx.policy, before, after)
    if violations:
        raise _Refused(violations)
    with _reverted_unless_safe(root, [rel]):
        full.parent.mkdir(parents=True, exist_ok=True)
        full.write_bytes(new.encode("utf-8"))
    added, removed = _counts(edit_diff) or (0, 0)
    total = _changed_lines(after)
    summary = (f"{'Created' if current is None else 'Edited'} {rel} (+{added} -{removed} lines; "
               f"the run's diff is now {total} of {ctx.policy.max_diff_lines} changed lines).")
    return ToolResult(True, _bounded(f"{summary}\n{edit_diff}"),
                      {"path": rel, "created": current is None, "added": added,
                       "removed": removed, "diff_lines": total,
                       "max_diff_lines": ctx.policy.max_diff_lines})


def _current_text(rel: str, full: Path) -> str | None:
    """The file's text, or None when it does not exist; _ToolError for binary/non-UTF-8."""
    if not full.exists():
        return None
    raw = _read_text_bytes(rel, full)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _ToolError(f"{rel} is not UTF-8 text", "Only UTF-8 text files can be edited."
                         ) from None


def _replaced(rel: str, current: str | None, old: str, new: str) -> str:
    if current is None:
        if old:
            raise _ToolError(f"{rel} does not exist", "To create it, call edit_file with "
                                                      "old_text ''.")
        return new
    if not old:
        if current:
            raise _ToolError(f"{rel} already exists; old_text '' only creates new files",
                             "Give the exact text to replace (read_file shows it).")
        return new
    count = current.count(old)
    if count != 1:
        raise _ToolError(f"old_text occurs {count} times in {rel}; it must occur exactly once",
                         "Read the file again and include enough surrounding lines to make "
                         "old_text unique." if count else
                         "Copy old_text exactly from read_file (without the line numbers).")
    result = current.replace(old, new, 1)
    if result == current:
        raise _ToolError("old_text and new_text are the same", "Nothing to change.")
    return result


def _base_text(ctx: ToolContext, root: Path, rel: str) -> str | None:
    raw = gitops.read_file(root, ctx.base_commit, rel)
    return None if raw is None else raw.decode("utf-8", "replace")


def _apply_diff(ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
    """Check the diff (policy, header tricks, the paths git would really write), dry-run
    it with ``git apply --check``, apply it; then re-check the run's whole diff against the
    cap and the touched paths for symlinks, putting the files back if either fails."""
    diff: str = args["diff"]
    if not diff.endswith("\n"):
        diff += "\n"
    root = ctx.worktree.resolve()
    violations = [*check_diff(diff, ctx.policy, existing=_repo_files(root)),
                  *_header_violations(diff)]
    try:
        paths = _apply_paths(root, diff)
    except _ToolError:
        if violations:
            raise _Refused(violations) from None
        raise
    for path in paths:
        violations += path_violations(path, ctx.policy) or _write_problems(ctx, path)
    if violations:
        raise _Refused(violations)
    try:
        gitops.git(root, "apply", "--check", "--whitespace=nowarn", "-", input=diff.encode())
    except gitops.GitError as exc:
        raise _ToolError(f"the diff does not apply: {exc}",
                         "Read the files again and rebuild the diff against their current "
                         "content.") from None
    before = _worktree_diff(ctx, root)
    with _reverted_unless_safe(root, paths) as after_checks:
        gitops.git(root, "apply", "--whitespace=nowarn", "-", input=diff.encode())
        after = _worktree_diff(ctx, root)
        after_checks.extend(_cap_violations(ctx.policy, before, after))
    total = _changed_lines(after)
    return ToolResult(True, _bounded(f"Applied the diff to {', '.join(paths)}; the run's diff is "
                                     f"now {total} of {ctx.policy.max_diff_lines} changed "
                                     "lines."),
                      {"paths": paths, "diff_lines": total,
                       "max_diff_lines": ctx.policy.max_diff_lines})


def _write_problems(ctx: ToolContext, path: str) -> list[Violation]:
    try:
        _resolve(ctx, path, write=True)
    except _Refused as exc:
        return exc.violations
    return []


# git reads the mode with strtoul(..., 8): "0120000" and "+120000" are a symlink too.
_SYMLINK_HEADER = re.compile(
    r"^(?:new file mode|deleted file mode|old mode|new mode"
    r"|index [0-9a-fA-F]+\.\.[0-9a-fA-F]+)[ \t]+\+?0*120000\s*$", re.MULTILINE)
_BINARY_HEADER = re.compile(r"^(?:GIT binary patch|Binary files .* differ)\s*$", re.MULTILINE)
_RENAME_HEADER = re.compile(r"^(?:rename|copy) (?:from|to) ", re.MULTILINE)


def _header_violations(diff: str) -> list[Violation]:
    found = []
    if _SYMLINK_HEADER.search(diff):
        found.append(Violation("(diff)", "symlinks may not be created or changed"))
    if _BINARY_HEADER.search(diff):
        found.append(Violation("(diff)", "binary patches are not accepted"))
    if _RENAME_HEADER.search(diff):
        found.append(Violation("(diff)", "renames and copies are not accepted; write them as "
                                         "a deletion and an addition"))
    return found


def _apply_paths(root: Path, diff: str) -> list[str]:
    """The paths ``git apply`` would write, as git itself reads the headers (``-p1``
    stripping included: the names check_diff reads can differ from them)."""
    try:
        output = gitops.git(root, "apply", "--numstat", "-z", "-", input=diff.encode())
    except gitops.GitError as exc:
        raise _ToolError(f"git cannot read the diff: {exc}",
                         "Send a unified diff with '--- a/<path>' and '+++ b/<path>' headers."
                         ) from None
    paths = []
    for record in output.split("\0"):
        fields = record.split("\t")
        if len(fields) == 3 and fields[2]:
            paths.append(fields[2])
    if not paths:
        raise _ToolError("the diff changes no file", "Send a unified diff with at least one "
                                                     "hunk.")
    return list(dict.fromkeys(paths))


@contextlib.contextmanager
def _reverted_unless_safe(root: Path, paths: Sequence[str]) -> Iterator[list[Violation]]:
    """Snapshot ``paths``, run the body (which writes them and may add violations to the
    yielded list), then check them as git really wrote them: no symlink leaving the
    repository, no new executable bit, no new file differing only in case from another
    (the checks before writing read the diff's headers, which git may read otherwise).
    On any violation or exception the files and the folders the body created are put
    back, and _Refused (or the exception) is raised."""
    saved = _Snapshot.take(root, paths)
    violations: list[Violation] = []
    try:
        yield violations
        violations += _escaping_symlinks(root, paths)
        violations += saved.new_problems(root)
    except BaseException:
        saved.restore()
        raise
    if violations:
        saved.restore()
        raise _Refused(violations)


@dataclass
class _Snapshot:
    files: dict[Path, tuple[bytes, int] | None]
    new_folders: list[Path]

    @classmethod
    def take(cls, root: Path, paths: Sequence[str]) -> _Snapshot:
        files: dict[Path, tuple[bytes, int] | None] = {}
        folders: dict[Path, None] = {}
        for path in paths:
            full = root / path
            files[full] = (full.read_bytes(), full.stat().st_mode) if full.is_file() else None
            folder = full.parent
            while folder != root and not folder.exists():
                folders[folder] = None
                folder = folder.parent
        return cls(files, sorted(folders, key=lambda f: len(f.parts), reverse=True))

    def new_problems(self, root: Path) -> list[Violation]:
        """Symlinks, executable bits and case collisions that the write brought in."""
        found: list[Violation] = []
        created: list[str] = []
        for full, saved in self.files.items():
            rel = full.relative_to(root).as_posix()
            if full.is_symlink():
                found.append(Violation(rel, "symlinks may not be created or changed"))
            if full.is_symlink() or not full.is_file():
                continue
            was_executable = saved is not None and bool(saved[1] & 0o111)
            if full.stat().st_mode & 0o111 and not was_executable:
                found.append(Violation(rel, f"would be executable (mode {EXECUTABLE_MODE}); "
                                            "mode changes are refused"))
            if saved is None:
                created.append(rel)
        if created:
            others = [name for name in _repo_files(root) if name not in created]
            found += case_collisions(created, others)
        return found

    def restore(self) -> None:
        for full, saved in self.files.items():
            if full.is_symlink() or (full.exists() and not full.is_dir()):
                full.unlink()
            if saved is not None:
                full.parent.mkdir(parents=True, exist_ok=True)
                full.write_bytes(saved[0])
                full.chmod(saved[1] & 0o7777)
        for folder in self.new_folders:
            with contextlib.suppress(OSError):
                folder.rmdir()


# --------------------------------------------------------------------------- diffs


def _worktree_diff(ctx: ToolContext, root: Path, *, without: str | None = None) -> str:
    """The run's accumulated diff: the worktree against ``base_commit``, leaving out
    ``without``. Tracked files as ``git diff <base>`` shows them; untracked, not ignored
    files (those ``git add --all`` would commit) as new-file diffs.

    Read-only on purpose: ``git add -A`` + ``diff --cached`` would get the same lines but
    rewrite the worktree's index on every check.
    """
    pathspec = [f":(top,exclude,literal){without}"] if without else []
    tracked = gitops.git(root, "diff", "--no-color", "--no-ext-diff", "--no-textconv",
                         "--no-renames", "--src-prefix=a/", "--dst-prefix=b/", ctx.base_commit,
                         "--", *pathspec)
    parts = [tracked]
    for name in _untracked(root):
        full = root / name
        if name == without or full.is_symlink() or not full.is_file():
            continue
        if full.stat().st_size > MAX_READ_BYTES:
            continue
        raw = full.read_bytes()
        if not _is_binary(raw):
            parts.append(_file_diff(name, None, raw.decode("utf-8", "replace")))
    return "".join(parts)


def _file_diff(path: str, old: str | None, new: str | None) -> str:
    """A git-style unified diff of one file (None: absent), "" when nothing changed."""
    if old == new:
        return ""
    lines = difflib.unified_diff(
        _diff_lines(old or ""), _diff_lines(new or ""),
        fromfile=f"a/{path}" if old is not None else "/dev/null",
        tofile=f"b/{path}" if new is not None else "/dev/null")
    return "".join(lines)


def _diff_lines(text: str) -> list[str]:
    # Split on "\n" only (str.splitlines also splits on \r, \f, \x1c...), and mark a last
    # line without newline the way diff does.
    *lines, last = text.split("\n")
    out = [f"{line}\n" for line in lines]
    if last:
        out.append(f"{last}\n\\ No newline at end of file\n")
    return out


def _cap_violations(policy: Policy, before: str, after: str) -> list[Violation]:
    """check_diff's verdict on the size of the run's whole diff after a write (its other
    findings concern files this write did not touch). A write that shrinks an oversized
    diff is let through; a diff that cannot be counted is judged, and so refused."""
    grown, shrunk = _changed_lines(after), _changed_lines(before)
    if grown is not None and shrunk is not None and grown <= shrunk:
        return []
    return [v for v in check_diff(after, policy) if v.path == "(diff)"]


def _counts(diff: str) -> tuple[int, int] | None:
    """(added, removed) lines of a unified diff, as check_diff counts them; None when it
    does not parse."""
    try:
        patch = PatchSet(diff)
    except UnidiffParseError:
        return None
    return sum(f.added for f in patch), sum(f.removed for f in patch)


def _changed_lines(diff: str) -> int | None:
    counts = _counts(diff)
    return None if counts is None else sum(counts)


_LOCAL_TOOLS: dict[str, Callable[[ToolContext, dict[str, Any]], ToolResult]] = {
    "list_files": _list_files,
    "read_file": _read_file,
    "search_code": _search_code,
    "edit_file": _edit_file,
    "apply_diff": _apply_diff,
}
