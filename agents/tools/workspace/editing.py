"""The writing tools: ``edit_file`` (one exact replacement, or a new file) and
``apply_diff`` (a unified diff, all or nothing), under the boundary of docs/product.md
("Git"), enforced through ``reviews.diff_policy``.

Contracts:

* Everything is checked before anything is written (the path, the forbidden patterns, the
  run's whole diff against its cap); a refusal leaves the worktree exactly as it was.
* What the files held is saved for undo (:mod:`.journal`) first; the write then runs inside
  :func:`.guard._reverted_unless_safe`.
* A Python file written is syntax-checked (:mod:`.syntax`); an error is reported, the write
  stays.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path
from typing import Any

from agents.tools.base import Refused, ToolContext, ToolError, ToolResult, bounded, tool
from agents.tools.schema import PATH, obj, string
from agents.tools.workspace.diffs import (
    _BINARY_HEADER,
    _cap_violations,
    _changed_lines,
    _counts,
    _file_diff,
    _worktree_diff,
)
from agents.tools.workspace.guard import _reverted_unless_safe
from agents.tools.workspace.journal import _journaled
from agents.tools.workspace.syntax import _syntax_report
from agents.tools.workspace.worktree import (
    _read_text_bytes,
    _repo_files,
    _resolve,
    _write_problems,
)
from infraops import gitops
from reviews.diff_policy import Violation, check_diff, path_violations

# --------------------------------------------------------------------------- edit_file


@tool(
    "edit_file",
    "Replace old_text (once in the file) with new_text; '' creates.",
    obj({
        "path": PATH,
        "old_text": string("Exact text to replace; it must occur exactly once. '' to "
                            "create a new file.", 200_000),
        "new_text": string("Replacement text.", 200_000),
    }, required=["path", "old_text", "new_text"]),
    untrusted=True,  # the result echoes the file's lines around the edit
)
def _edit_file(ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
    """Exact replacement, checked before anything is written: the path against the
    boundary, the edit's own diff for forbidden patterns, and the run's whole diff (the
    worktree against base_commit, this file as it would be after the edit) for the cap.
    What the file held before is saved for undo first; a Python file is syntax-checked after
    the write (an error is reported, the edit stays)."""
    path_problems = path_violations(args["path"], ctx.policy)
    if path_problems:
        raise Refused(path_problems)
    if "\0" in args["new_text"]:
        # A NUL makes the file binary to git: it would leave the diff and its cap unseen.
        raise ToolError("new_text contains a NUL character", "Only text can be written; "
                        "leave out NUL bytes.")
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
        raise Refused(violations)
    with _journaled(root, "edit_file", [rel]), _reverted_unless_safe(root, [rel]):
        full.parent.mkdir(parents=True, exist_ok=True)
        full.write_bytes(new.encode("utf-8"))
    added, removed = _counts(edit_diff) or (0, 0)
    total = _changed_lines(after)
    summary = (f"{'Created' if current is None else 'Edited'} {rel} (+{added} -{removed} lines; "
               f"the run's diff is now {total} of {ctx.policy.max_diff_lines} changed lines).")
    notes, syntax = _syntax_report(root, [rel])
    return ToolResult(True, bounded("\n".join([summary, *notes, edit_diff])),
                      {"path": rel, "created": current is None, "added": added,
                       "removed": removed, "diff_lines": total,
                       "max_diff_lines": ctx.policy.max_diff_lines, **syntax})


def _current_text(rel: str, full: Path) -> str | None:
    """The file's text, or None when it does not exist; ToolError for binary/non-UTF-8."""
    if not full.exists():
        return None
    raw = _read_text_bytes(rel, full)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ToolError(f"{rel} is not UTF-8 text", "Only UTF-8 text files can be edited."
                         ) from None


def _replaced(rel: str, current: str | None, old: str, new: str) -> str:
    if current is None:
        if old:
            raise ToolError(f"{rel} does not exist", "To create it, call edit_file with "
                                                      "old_text ''.")
        return new
    if not old:
        if current:
            raise ToolError(f"{rel} already exists; old_text '' only creates new files",
                             "Give the exact text to replace (read_file shows it).")
        return new
    count = current.count(old)
    if count != 1:
        raise ToolError(f"old_text occurs {count} times in {rel}; it must occur exactly once",
                         "Read the file again and include enough surrounding lines to make "
                         "old_text unique." if count else
                         "Copy old_text exactly from read_file (without the line numbers).")
    result = current.replace(old, new, 1)
    if result == current:
        raise ToolError("old_text and new_text are the same", "Nothing to change.")
    return result


def _base_text(ctx: ToolContext, root: Path, rel: str) -> str | None:
    raw = gitops.read_file(root, ctx.base_commit, rel)
    return None if raw is None else raw.decode("utf-8", "replace")


# --------------------------------------------------------------------------- apply_diff


@tool(
    "apply_diff",
    "Apply a unified diff.",
    obj({"diff": string("The unified diff.", 500_000, minLength=1)},
            required=["diff"]),
    untrusted=True,  # the result echoes repository text (a syntax error's line)
)
def _apply_diff(ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
    """Check the diff (policy, header tricks, the paths git would really write), dry-run
    it with ``git apply --check``, apply it; then re-check the run's whole diff against the
    cap and the touched paths for symlinks, putting the files back if either fails. What the
    files held before is saved for undo first; the Python files it wrote are syntax-checked
    (an error is reported, the diff stays applied)."""
    diff: str = args["diff"]
    if not diff.endswith("\n"):
        diff += "\n"
    root = ctx.worktree.resolve()
    violations = [*check_diff(diff, ctx.policy, existing=_repo_files(root)),
                  *_header_violations(diff)]
    try:
        paths = _apply_paths(root, diff)
    except ToolError:
        if violations:
            raise Refused(violations) from None
        raise
    for path in paths:
        violations += path_violations(path, ctx.policy) or _write_problems(ctx, path)
    if violations:
        raise Refused(violations)
    try:
        gitops.git(root, "apply", "--check", "--whitespace=nowarn", "-", input=diff.encode())
    except gitops.GitError as exc:
        raise ToolError(f"the diff does not apply: {exc}",
                         "Read the files again and rebuild the diff against their current "
                         "content.") from None
    before = _worktree_diff(ctx, root)
    with (_journaled(root, "apply_diff", paths),
          _reverted_unless_safe(root, paths) as after_checks):
        gitops.git(root, "apply", "--whitespace=nowarn", "-", input=diff.encode())
        after = _worktree_diff(ctx, root)
        after_checks.extend(_cap_violations(ctx.policy, before, after))
    total = _changed_lines(after)
    summary = (f"Applied the diff to {', '.join(paths)}; the run's diff is now {total} of "
               f"{ctx.policy.max_diff_lines} changed lines.")
    notes, syntax = _syntax_report(root, paths)
    return ToolResult(True, bounded("\n".join([summary, *notes])),
                      {"paths": paths, "diff_lines": total,
                       "max_diff_lines": ctx.policy.max_diff_lines, **syntax})


# git reads the mode with strtoul(..., 8): "0120000" and "+120000" are a symlink too.
_SYMLINK_HEADER = re.compile(
    r"^(?:new file mode|deleted file mode|old mode|new mode"
    r"|index [0-9a-fA-F]+\.\.[0-9a-fA-F]+)[ \t]+\+?0*120000\s*$", re.MULTILINE)
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
        raise ToolError(f"git cannot read the diff: {exc}",
                         "Send a unified diff with '--- a/<path>' and '+++ b/<path>' headers."
                         ) from None
    paths = []
    for record in output.split("\0"):
        fields = record.split("\t")
        if len(fields) == 3 and fields[2]:
            paths.append(fields[2])
    if not paths:
        raise ToolError("the diff changes no file", "Send a unified diff with at least one "
                                                     "hunk.")
    return list(dict.fromkeys(paths))
