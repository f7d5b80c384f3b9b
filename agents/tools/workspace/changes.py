"""The run's changes as a whole: ``show_diff`` (the worktree against the base commit) and
``revert`` (one file back to the base commit, or the last write undone from the journal).

Contracts:

* ``show_diff`` is read-only and shows the diff the cap counts, cut to fit the result.
* A revert writes only where the boundary lets the agent write, and is checked as an edit is
  (the cap, forbidden patterns, the base commit's executable bits); a file already as at base
  is "nothing to revert", whatever the boundary says of it.
* An undo changes nothing when a file changed since the journaled write.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from unidiff.errors import UnidiffParseError
from unidiff.patch import PatchSet

from agents.tools.base import (
    MAX_RESULT_CHARS,
    ArgumentError,
    Refused,
    ToolContext,
    ToolError,
    ToolResult,
    bounded,
    shorten,
    tool,
)
from agents.tools.schema import obj, string
from agents.tools.workspace.diffs import (
    _BINARY_HEADER,
    _cap_violations,
    _changed_lines,
    _counts,
    _diff_and_omitted,
    _shown_change,
    _worktree_diff,
)
from agents.tools.workspace.guard import _reverted_unless_safe
from agents.tools.workspace.journal import (
    _blob,
    _entry_label,
    _fingerprint,
    _journaled,
    _load_entry,
    _undo_home,
    _write_json,
)
from agents.tools.workspace.worktree import MAX_LINE_CHARS, _file_state, _resolve, _write_problems
from infraops import gitops
from reviews.diff_policy import Violation, check_diff, path_violations

_STAT_PATH_CHARS = 120
_EXECUTABLE = 0o100755
_FILE_MODES = frozenset({0o100644, _EXECUTABLE})


# --------------------------------------------------------------------------- show_diff


@tool(
    "show_diff",
    "Your diff against the base.",
    obj({"path": string("Only this file or folder, repository-relative.", 1_000,
                        minLength=1)}),
    untrusted=True,
)
def _show_diff(ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
    """The run's diff as the cap counts it (tracked and untracked files), a --stat-like
    summary first; cut at a line to fit the result, saying at which of how many lines.
    Untracked files without a text diff (binary, symlinks, too large) are counted and named
    in the summary."""
    root = ctx.worktree.resolve()
    rel = _resolve(ctx, args["path"], write=False)[0] if "path" in args else ""
    diff, omitted = _diff_and_omitted(ctx, root, only=rel or None)
    scope = f" to {rel}" if rel else ""
    if not diff and not omitted:
        return ToolResult(True, f"No changes{scope}: the worktree is as it is at the base "
                                f"commit {ctx.base_commit[:10]}.",
                          {"path": rel, "files": 0, "added": 0, "removed": 0,
                           "total_lines": 0, "shown_lines": 0, "truncated": False,
                           "omitted": []})
    stat = _stat(diff)
    lines = diff.split("\n")
    if lines[-1] == "":
        lines.pop()
    budget = MAX_RESULT_CHARS - 800
    rows = _stat_rows(stat, omitted, budget // 2)
    body = _fitting(lines, budget - sum(len(row) + 1 for row in rows))
    tail = [f"[diff cut at line {len(body)} of {len(lines)}; call show_diff with `path` for "
            "one file]"] if len(body) < len(lines) else []
    files, added, removed = (len(stat) + len(omitted), sum(r[1] for r in stat),
                             sum(r[2] for r in stat)) if stat is not None else (None, None, None)
    summary = (f"{files} {'file' if files == 1 else 'files'} changed, +{added} -{removed}"
               if stat is not None else "changes could not be counted")
    header = f"The run's diff{scope} against the base commit {ctx.base_commit[:10]}: {summary}"
    return ToolResult(True, bounded("\n".join([header, *rows, *body, *tail])),
                      {"path": rel, "files": files, "added": added, "removed": removed,
                       "total_lines": len(lines), "shown_lines": len(body),
                       "truncated": len(body) < len(lines),
                       "omitted": [f"{name} ({why})" for name, why in omitted[:100]]})


def _stat(diff: str) -> list[tuple[str, int, int, str]] | None:
    """(path, added, removed, what) for each file of ``diff`` ('new', 'deleted', 'binary'
    or ''); None when it does not parse."""
    try:
        patch = PatchSet(diff)
    except UnidiffParseError:
        return None
    rows = []
    for patched in patch:
        tags = [tag for tag, on in (("new", patched.is_added_file),
                                    ("deleted", patched.is_removed_file),
                                    ("binary", bool(_BINARY_HEADER.search(
                                        str(patched.patch_info or ""))))) if on]
        rows.append((patched.path, patched.added, patched.removed, ", ".join(tags)))
    return rows


def _stat_rows(stat: list[tuple[str, int, int, str]] | None,
               omitted: Sequence[tuple[str, str]], budget: int) -> list[str]:
    """One ' path | +added -removed (what)' row a file, then the files without a text diff,
    as many as fit in ``budget`` characters."""
    rows = [f" {shorten(path, _STAT_PATH_CHARS)} | +{added} -{removed}"
            f"{f' ({what})' if what else ''}" for path, added, removed, what in stat or ()]
    rows += [f" {shorten(name, _STAT_PATH_CHARS)} | no text diff ({why})"
             for name, why in omitted]
    shown = _fitting(rows, budget)
    if len(shown) < len(rows):
        shown.append(f" ... and {len(rows) - len(shown)} more files")
    return shown


def _fitting(lines: Sequence[str], budget: int) -> list[str]:
    """The leading ``lines`` that fit in ``budget`` characters (newlines counted), each cut
    at MAX_LINE_CHARS."""
    out: list[str] = []
    for line in lines:
        if len(line) > MAX_LINE_CHARS:
            line = line[:MAX_LINE_CHARS] + f" [line cut: {len(line)} characters]"
        budget -= len(line) + 1
        if budget < 0:
            break
        out.append(line)
    return out


# --------------------------------------------------------------------------- revert


@tool(
    "revert",
    "Undo a file's edits, or the last edit.",
    obj({
        "path": string("File to put back as it is at the base commit.", 1_000, minLength=1),
        "last_edit": {"type": "boolean", "description": "Undo the last successful edit_file, "
                      "apply_diff or revert of a file (one level)."},
    }),
)
def _revert(ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
    """``path`` (revert one file to base) or the last edit, never both; ``last_edit: false``
    without ``path`` asks for nothing and is an argument error."""
    if "path" in args:
        if args.get("last_edit"):
            raise ArgumentError("last_edit", "give `path` or `last_edit`, not both",
                                "`path` puts one file back as it is at the base commit; "
                                "`last_edit: true` undoes the last edit.")
        return _revert_path(ctx, args["path"])
    if args.get("last_edit") is False:
        raise ArgumentError("last_edit", "`last_edit` is false and no `path` is given: "
                                         "nothing to revert",
                            "Give `path` to revert a file, or `last_edit: true` to undo the "
                            "last edit.")
    return _undo_last(ctx)


def _revert_path(ctx: ToolContext, path: str) -> ToolResult:
    """Put ``path`` back as it is at the base commit: its bytes and executable bit, or no
    file (and no empty folder left behind) when the base commit has none. A file already as
    at base is "nothing to revert", whatever the boundary says of it; one that differs is
    written only where the boundary lets the agent write. The write is journaled (undoable)."""
    rel, full = _resolve(ctx, path, write=True)
    if not rel or full.is_dir():
        raise ToolError(f"{rel or '.'} is a folder; revert puts back one file",
                        "Revert its files one at a time; show_diff with `path` lists the "
                        "changed ones.")
    root = ctx.worktree.resolve()
    base = _base_entry(ctx, root, rel)
    current = _file_state(full)
    if current == (None if base is None else (base[1], base[0] == _EXECUTABLE)):
        return ToolResult(True, f"Nothing to revert: {rel} is as it is at the base commit.",
                          {"path": rel, "reverted": False})
    problems = path_violations(rel, ctx.policy)
    if base is not None and base[0] not in _FILE_MODES:
        problems.append(Violation(rel, "is a symlink or submodule at the base commit; those "
                                       "are never written"))
    if problems:
        raise Refused(problems)
    executable = [rel] if base is not None and base[0] == _EXECUTABLE else []
    with (_journaled(root, "revert", [rel]),
          _reverted_unless_safe(root, [rel], executable_ok=executable)):
        _put(full, *((base[1], base[0] & 0o777) if base is not None else (None, None)))
        if base is None:
            _prune_empty(root, full.parent)
    change = _shown_change(rel, current and current[0], base and base[1])
    added, removed = _counts(change) or (0, 0)
    action = ("deleted" if base is None else "restored" if current is None else "reverted")
    summary = {"deleted": f"Deleted {rel} (the base commit has no such file).",
               "restored": f"Restored {rel} as it is at the base commit (the run had deleted "
                           "it).",
               "reverted": f"Reverted {rel} to the base commit (+{added} -{removed} lines)."}
    total = _changed_lines(_worktree_diff(ctx, root))
    return ToolResult(True, bounded(f"{summary[action]} The run's diff is now {total} of "
                                    f"{ctx.policy.max_diff_lines} changed lines.\n{change}"),
                      {"path": rel, "reverted": True, "action": action, "added": added,
                       "removed": removed, "diff_lines": total,
                       "max_diff_lines": ctx.policy.max_diff_lines})


def _undo_last(ctx: ToolContext) -> ToolResult:
    """Put the files of the last journaled write back as they were before it, if nothing has
    changed them since; the boundary, the cap and the base commit's executable bits are
    checked as for an edit (a journal is trusted, what it writes is checked anyway). The
    entry is then marked undone: a second undo says so."""
    root = ctx.worktree.resolve()
    home = _undo_home(root)
    entry = _load_entry(home)
    if entry is None:
        raise ToolError("nothing to undo: no edit_file, apply_diff or revert has changed a "
                        "file in this run yet", "Use show_diff to see the run's changes.")
    what = _entry_label(entry)
    if entry["undone"]:
        raise ToolError(f"nothing to undo: the last write ({what}) was already undone; only "
                        "one level of undo is kept",
                        "Use show_diff to see the run's changes, and revert with `path` to "
                        "put a file back as it is at the base commit.")
    paths = [item["path"] for item in entry["files"]]
    _check_undo(ctx, root, entry, what)
    saved = [(item["path"], _blob(home, item), item["mode"]) for item in entry["files"]]
    olds = {rel: _file_state(root / rel) for rel in paths}
    modes = _base_modes(ctx, root, paths)
    before = _worktree_diff(ctx, root)
    with _reverted_unless_safe(root, paths, executable_ok=[
            rel for rel in paths if modes.get(rel) == _EXECUTABLE]) as checks:
        for rel, data, mode in saved:
            _put(root / rel, data, mode)
        for folder in entry["folders"]:
            with contextlib.suppress(OSError):
                (root / folder).rmdir()
        after = _worktree_diff(ctx, root)
        checks += _cap_violations(ctx.policy, before, after)
        checks += _restored_violations(ctx, root, paths)
    entry["undone"] = True
    with contextlib.suppress(OSError):
        _write_json(home / "journal.json", entry)
    lines = [f"{rel}: {_undo_action(olds[rel], data)}" for rel, data, _ in saved]
    changes = [_shown_change(rel, (old := olds[rel]) and old[0], data)
               for rel, data, _ in saved]
    total = _changed_lines(after)
    return ToolResult(True, bounded("\n".join([
        f"Undid the last write ({what}); the run's diff is now {total} of "
        f"{ctx.policy.max_diff_lines} changed lines.", *lines, "".join(changes)])),
        {"undone": entry["tool"], "paths": paths, "diff_lines": total,
         "max_diff_lines": ctx.policy.max_diff_lines})


def _check_undo(ctx: ToolContext, root: Path, entry: dict[str, Any], what: str) -> None:
    """Refused when a journaled path is one the agent may not write; ToolError when a file
    changed since the journaled write (undoing would lose that change)."""
    violations: list[Violation] = []
    for item in entry["files"]:
        violations += path_violations(item["path"], ctx.policy) or _write_problems(
            ctx, item["path"])
    for folder in entry["folders"]:
        violations += _write_problems(ctx, folder)
    if violations:
        raise Refused(violations)
    after = entry["after"]
    changed = [item["path"] for item in entry["files"] if after is not None
               and after.get(item["path"]) != _fingerprint(root / item["path"])]
    if changed:
        raise ToolError(f"{', '.join(changed)} changed since the last write ({what}); undoing "
                        "it would lose those changes, so nothing was changed",
                        "Use revert with `path` to put a file back as it is at the base "
                        "commit, or edit it.")


def _restored_violations(ctx: ToolContext, root: Path, paths: Sequence[str]) -> list[Violation]:
    """What check_diff finds in ``paths`` as they now differ from the base commit (forbidden
    patterns, paths), the caps aside (the run's whole diff is judged on its own)."""
    parts = []
    for rel in paths:
        base, state = _base_entry(ctx, root, rel), _file_state(root / rel)
        parts.append(_shown_change(rel, base and base[1], state and state[0]))
    diff = "".join(parts)
    uncapped = dataclasses.replace(ctx.policy, max_diff_lines=sys.maxsize,
                                   max_diff_bytes=sys.maxsize, max_files=sys.maxsize)
    return check_diff(diff, uncapped)


def _undo_action(old: tuple[bytes, bool] | None, new: bytes | None) -> str:
    if new is None:
        return "deleted (the write had created it)" if old is not None else "absent, as before"
    return "restored (the write had deleted it)" if old is None else "restored"


def _base_modes(ctx: ToolContext, root: Path, paths: Sequence[str]) -> dict[str, int]:
    """Git's mode of each of ``paths`` that is a blob or link at the base commit."""
    if not paths:
        return {}
    output = gitops.git(root, "--literal-pathspecs", "ls-tree", "-z", "--full-tree",
                        ctx.base_commit, "--", *paths)
    modes: dict[str, int] = {}
    for record in output.split("\0"):
        info, _, name = record.partition("\t")
        fields = info.split(" ")
        if name in paths and len(fields) == 3 and fields[1] in ("blob", "commit"):
            modes[name] = int(fields[0], 8)
    return modes


def _base_entry(ctx: ToolContext, root: Path, rel: str) -> tuple[int, bytes] | None:
    """(git mode, bytes) of ``rel`` at the base commit; None when it has no such entry."""
    mode = _base_modes(ctx, root, [rel]).get(rel)
    if mode is None:
        return None
    return mode, gitops.read_file(root, ctx.base_commit, rel) or b""


def _put(full: Path, data: bytes | None, mode: int | None) -> None:
    """Make ``full`` hold ``data`` with permission bits ``mode`` (default 0644), creating its
    folders, or not exist when ``data`` is None."""
    if data is None:
        if full.is_symlink() or full.is_file():
            full.unlink()
        return
    full.parent.mkdir(parents=True, exist_ok=True)
    full.write_bytes(data)
    full.chmod((0o644 if mode is None else mode) & 0o777)


def _prune_empty(root: Path, folder: Path) -> None:
    """Remove ``folder`` and its parents while they are empty (git keeps no empty folder)."""
    while folder != root and folder.is_dir() and not folder.is_symlink():
        if any(folder.iterdir()):
            return
        folder.rmdir()
        folder = folder.parent
