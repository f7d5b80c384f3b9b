"""The reading tools: ``list_files`` and ``read_file``.

Contract: file contents come back verbatim as data (read_file's lines numbered, cut to the
result's budget with the line to continue from); nothing read is interpreted here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agents.tools.base import MAX_RESULT_CHARS, ToolContext, ToolError, ToolResult, bounded, tool
from agents.tools.schema import MAX_LINE, PATH, integer, obj, string
from agents.tools.workspace.worktree import (
    MAX_LINE_CHARS,
    _read_text_bytes,
    _repo_files,
    _resolve,
)
from infraops.manifest import glob_match

MAX_LIST_ENTRIES = 500
DEFAULT_READ_LINES = 400


@tool(
    "list_files",
    "List files under a folder (glob).",
    obj({
        "path": string("Folder to list, repository-relative; '' for the root.", 1_000,
                        default=""),
        "glob": string("Glob relative to `path`, e.g. '**/*.py'.", 200, default="**"),
    }), untrusted=True,
)
def _list_files(ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
    rel, full = _resolve(ctx, args["path"], write=False)
    if rel and not full.is_dir():
        raise ToolError(f"{rel} is not a folder", "Use read_file for a file; list_files "
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
    return ToolResult(True, bounded("\n".join([header, *lines])),
                      {"path": rel, "glob": args["glob"], "count": len(chosen),
                       "shown": len(shown)})


@tool(
    "read_file",
    "Numbered lines of a file.",
    obj({
        "path": PATH,
        "start_line": integer("First line, 1-based.", 1, MAX_LINE, default=1),
        "end_line": integer("Last line, inclusive (default start_line + 399).", 1,
                             MAX_LINE),
    }, required=["path"]), untrusted=True,
)
def _read_file(ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
    rel, full = _resolve(ctx, args["path"], write=False)
    raw = _read_text_bytes(rel, full)
    start = args["start_line"]
    end = args.get("end_line", start + DEFAULT_READ_LINES - 1)
    if end < start:
        raise ToolError(f"end_line {end} is before start_line {start}",
                         "Give end_line >= start_line.")
    lines = raw.decode("utf-8", "replace").split("\n")
    if lines[-1] == "":
        lines.pop()
    total = len(lines)
    if total and start > total:
        raise ToolError(f"start_line {start} is past the end of {rel} ({total} lines)",
                         f"Read from a line between 1 and {total}.")
    body, last = _numbered(lines, start, min(end, total))
    header = f"{rel}, lines {start}-{last} of {total}:" if total else f"{rel} is empty."
    if last < min(end, total):
        body.append(f"[cut at line {last} to stay within {MAX_RESULT_CHARS} characters; "
                    f"continue with start_line={last + 1}]")
    return ToolResult(True, bounded("\n".join([header, *body])),
                      {"path": rel, "start_line": start, "end_line": last,
                       "total_lines": total})


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
