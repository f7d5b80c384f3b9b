"""The run's diff as the boundary's cap counts it: the worktree against the base commit,
tracked and untracked files alike, and the diffs and counts the tools build from it.

Contracts:

* Read-only: nothing here writes the worktree or its index.
* :func:`_cap_violations` is the one verdict on the size of the run's whole diff after a
  write; a diff that cannot be counted is judged by ``check_diff``, and so refused.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path

from unidiff.errors import UnidiffParseError
from unidiff.patch import PatchSet

from agents.tools.base import ToolContext
from agents.tools.workspace.worktree import MAX_READ_BYTES, _is_binary, _untracked
from infraops import gitops
from reviews.diff_policy import Policy, Violation, check_diff

_BINARY_HEADER = re.compile(r"^(?:GIT binary patch|Binary files .* differ)\s*$", re.MULTILINE)


def _worktree_diff(ctx: ToolContext, root: Path, *, without: str | None = None,
                   only: str | None = None) -> str:
    """The run's accumulated diff: the worktree against ``base_commit``, leaving out
    ``without`` (a file), or only the file or folder ``only``. Tracked files as ``git diff
    <base>`` shows them; untracked, not ignored files (those ``git add --all`` would commit)
    as new-file diffs.

    Read-only on purpose: ``git add -A`` + ``diff --cached`` would get the same lines but
    rewrite the worktree's index on every check.
    """
    return _diff_and_omitted(ctx, root, without=without, only=only)[0]


def _diff_and_omitted(ctx: ToolContext, root: Path, *, without: str | None = None,
                      only: str | None = None) -> tuple[str, list[tuple[str, str]]]:
    """:func:`_worktree_diff`, and the untracked files it leaves out as (path, why):
    symlinks, binary files and files over MAX_READ_BYTES have no text diff."""
    if without:
        pathspec = [f":(top,exclude,literal){without}"]
    else:
        pathspec = [f":(top,literal){only}"] if only else []
    tracked = gitops.git(root, "diff", "--no-color", "--no-ext-diff", "--no-textconv",
                         "--no-renames", "--src-prefix=a/", "--dst-prefix=b/", ctx.base_commit,
                         "--", *pathspec)
    parts, omitted = [tracked], list[tuple[str, str]]()
    for name in _untracked(root):
        full = root / name
        if name == without or (only and not _within(name, only)):
            continue
        if full.is_symlink():
            omitted.append((name, "new symlink"))
        elif not full.is_file():
            continue
        elif full.stat().st_size > MAX_READ_BYTES:
            omitted.append((name, f"new file over {MAX_READ_BYTES} bytes"))
        else:
            raw = full.read_bytes()
            if _is_binary(raw):
                omitted.append((name, "new binary file"))
            else:
                parts.append(_file_diff(name, None, raw.decode("utf-8", "replace")))
    return "".join(parts), omitted


def _within(name: str, folder_or_file: str) -> bool:
    return name == folder_or_file or name.startswith(f"{folder_or_file}/")


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


def _shown_change(rel: str, old: bytes | None, new: bytes | None) -> str:
    """The diff from ``old`` to ``new`` (None: absent) for the model; one line for binary."""
    if any(raw is not None and _is_binary(raw) for raw in (old, new)):
        return f"({rel}: binary file, not shown)\n" if old != new else ""
    return _file_diff(rel, None if old is None else old.decode("utf-8", "replace"),
                      None if new is None else new.decode("utf-8", "replace"))
