"""Workspace tools: list, read and search the run's git worktree; edit a file or apply a
diff under the boundary of docs/product.md ("Git"), enforced through ``reviews.diff_policy``;
show the run's diff and revert a file or the last edit.

Contracts:

* File contents come back verbatim as data: nothing read from the repository is ever
  interpreted here (the LLM policy marks it untrusted for the model). A Python file an edit
  writes is compiled to check its syntax, never imported or run.
* A refusal by the boundary leaves the worktree exactly as it was.
* Every successful write (edit_file, apply_diff, revert of a file) first saves what its files
  held into a one-level undo journal in the worktree's private git dir (never in the work
  tree, so never in the diff or a commit); ``revert`` with ``last_edit`` plays it back.
* Nothing here imports a Django model: the tools work on any git worktree.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import hashlib
import importlib
import json
import re
import shutil
import signal
import sys
import threading
import time
import warnings
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from types import FrameType
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
from agents.tools.schema import MAX_LINE, PATH, integer, obj, string
from infraops import gitops
from infraops.manifest import glob_match
from reviews.diff_policy import (
    EXECUTABLE_MODE,
    Policy,
    Violation,
    case_collisions,
    check_diff,
    path_violations,
)

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
SYNTAX_MAX_BYTES = 1_000_000
UNDO_FOLDER = "infraops-undo"
_SHOWN_MATCH_CHARS = 300
_BINARY_SNIFF_BYTES = 8_000
_SHOWN_SYNTAX_CHARS = 200
_STAT_PATH_CHARS = 120
_EXECUTABLE = 0o100755
_FILE_MODES = frozenset({0o100644, _EXECUTABLE})


# --------------------------------------------------------------------------- paths


def _resolve(ctx: ToolContext, path: str, *, write: bool) -> tuple[str, Path]:
    """(normalised repository-relative path, absolute path) of ``path`` in the worktree.

    Refused when it leaves the worktree (absolute, '..', a symlink resolving outside),
    names .git, or, for a write, goes through any symlink (a write through a link would
    change a file the boundary check never saw).
    """
    root = ctx.worktree.resolve()
    if any(ch in path for ch in "\0\n\r"):
        raise ToolError(f"path {shorten(path)!r} contains control characters",
                         "Give a plain repository-relative path.")
    pure = PurePosixPath(path)
    if pure.is_absolute() or ".." in pure.parts:
        raise Refused([Violation(shorten(path), "leaves the repository")])
    parts = [part for part in pure.parts if part != "."]
    rel = "/".join(parts)
    if ".git" in parts:
        raise Refused([Violation(rel, "is inside .git")])
    full = root.joinpath(*parts)
    try:
        inner = full.resolve().relative_to(root).parts
    except ValueError:
        raise Refused([Violation(rel, "resolves outside the repository (symlink)")]) from None
    except (RuntimeError, OSError):
        raise Refused([Violation(rel, "cannot be resolved (symlink loop)")]) from None
    if ".git" in inner:
        raise Refused([Violation(rel, "resolves into .git (symlink)")])
    if write:
        link = _first_symlink(root, parts)
        if link is not None:
            raise Refused([Violation(rel, f"goes through the symlink {link}; symlinks are "
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


@tool(
    "list_files",
    "List the repository's files (tracked and new, not ignored; never .git) under a folder, "
    f"filtered by a glob relative to that folder ('**' any depth). At most "
    f"{MAX_LIST_ENTRIES} entries.",
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
    "Read a text file's lines with line numbers (default: 400 lines from start_line). "
    "Long output is cut; the result says where to continue.",
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


def _read_text_bytes(rel: str, full: Path) -> bytes:
    if full.is_dir():
        raise ToolError(f"{rel} is a folder", "Use list_files to see what it contains.")
    if not full.is_file():
        raise ToolError(f"{rel} does not exist", "Use list_files or search_code to find files.")
    size = full.stat().st_size
    if size > MAX_READ_BYTES:
        raise ToolError(f"{rel} is too large to read ({size} bytes)",
                         "Use search_code to find the part you need.")
    raw = full.read_bytes()
    if _is_binary(raw):
        raise ToolError(f"{rel} is a binary file ({size} bytes)",
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


@tool(
    "search_code",
    "Search the repository's text files with a Python regular expression (at most "
    f"{MAX_PATTERN_CHARS} characters; no backreferences, no quantifier or alternation "
    "inside a repeated group). Returns 'path:line: text' for each match, at most "
    f"{SEARCH_MAX_MATCHES}.",
    obj({
        "pattern": string("Regular expression (Python syntax).", MAX_PATTERN_CHARS,
                           minLength=1),
        "path_glob": string("Only files whose repository-relative path matches this "
                             "glob, e.g. 'src/**/*.py'.", 200, default="**"),
        "ignore_case": {"type": "boolean", "description": "Case-insensitive match.",
                        "default": False},
    }, required=["pattern"]), untrusted=True,
)
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
    return ToolResult(True, bounded("\n".join([header, *lines, *scan.notes])),
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
    """The compiled pattern; ArgumentError naming `pattern` when it is invalid or can
    backtrack catastrophically (exponential time on one line)."""
    flags = re.IGNORECASE if ignore_case else 0
    try:
        compiled = re.compile(pattern, flags)
        problem = _backtracking_problem(_sre.parse(pattern, flags), repeated=False)
    except (re.error, RecursionError, OverflowError) as exc:
        raise ArgumentError("pattern", f"`pattern` is not a valid regular expression: {exc}",
                             "Fix the pattern (Python re syntax).") from None
    if problem:
        raise ArgumentError("pattern", f"`pattern` is refused: {problem}",
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


@tool(
    "edit_file",
    "Replace the one exact occurrence of old_text with new_text in a file. With old_text "
    "'' a new file is created. Edits must stay inside the editable paths, off protected "
    "paths, free of forbidden patterns and within the run's diff-size cap; a refused edit "
    "writes nothing and says why. A Python file's syntax is checked after the write (an "
    "error is reported; the edit stays). revert with last_edit undoes it.",
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


@tool(
    "apply_diff",
    "Apply a unified diff (git style, a/ and b/ prefixes) to the worktree. It is checked "
    "against the run's boundaries first and applied all or nothing; no symlinks, binary "
    "patches, renames or copies. Python files it writes are syntax-checked (errors are "
    "reported; the diff stays applied). revert with last_edit undoes it.",
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


def _write_problems(ctx: ToolContext, path: str) -> list[Violation]:
    try:
        _resolve(ctx, path, write=True)
    except Refused as exc:
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


@contextlib.contextmanager
def _reverted_unless_safe(root: Path, paths: Sequence[str], *,
                          executable_ok: Collection[str] = ()) -> Iterator[list[Violation]]:
    """Snapshot ``paths``, run the body (which writes them and may add violations to the
    yielded list), then check them as git really wrote them: no symlink leaving the
    repository, no new executable bit (except on ``executable_ok``: files a revert puts back
    as executable as they are at the base commit), no new file differing only in case from
    another (the checks before writing read the diff's headers, which git may read
    otherwise). On any violation or exception the files and the folders the body created are
    put back, and Refused (or the exception) is raised."""
    saved = _Snapshot.take(root, paths)
    violations: list[Violation] = []
    try:
        yield violations
        violations += _escaping_symlinks(root, paths)
        violations += saved.new_problems(root, executable_ok=executable_ok)
    except BaseException:
        saved.restore()
        raise
    if violations:
        saved.restore()
        raise Refused(violations)


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

    def new_problems(self, root: Path, *,
                     executable_ok: Collection[str] = ()) -> list[Violation]:
        """Symlinks, executable bits (outside ``executable_ok``) and case collisions that the
        write brought in."""
        found: list[Violation] = []
        created: list[str] = []
        for full, saved in self.files.items():
            rel = full.relative_to(root).as_posix()
            if full.is_symlink():
                found.append(Violation(rel, "symlinks may not be created or changed"))
            if full.is_symlink() or not full.is_file():
                continue
            was_executable = saved is not None and bool(saved[1] & 0o111)
            if full.stat().st_mode & 0o111 and not was_executable and rel not in executable_ok:
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


# --------------------------------------------------------------------------- show and revert


@tool(
    "show_diff",
    "Show the run's whole diff so far: the worktree against the base commit (edits, new and "
    "deleted files), after a summary of the files changed and the lines added and removed. "
    "`path` limits it to one file (or folder). A long diff is cut; the result says where and "
    "how long the whole diff is.",
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


@tool(
    "revert",
    "Undo changes. With `path`: put that file back as it is at the base commit (a file the "
    "run created is deleted, one it deleted comes back). With `last_edit: true` (or no "
    "arguments): undo the last successful edit_file, apply_diff or revert of a file; only "
    "one level of undo is kept. Says what changed.",
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


def _file_state(full: Path) -> tuple[bytes, bool] | None:
    """(bytes, executable) of a regular file; None when there is none."""
    if full.is_symlink() or not full.is_file():
        return None
    return full.read_bytes(), bool(full.stat().st_mode & 0o111)


def _shown_change(rel: str, old: bytes | None, new: bytes | None) -> str:
    """The diff from ``old`` to ``new`` (None: absent) for the model; one line for binary."""
    if any(raw is not None and _is_binary(raw) for raw in (old, new)):
        return f"({rel}: binary file, not shown)\n" if old != new else ""
    return _file_diff(rel, None if old is None else old.decode("utf-8", "replace"),
                      None if new is None else new.decode("utf-8", "replace"))


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


# --------------------------------------------------------------------------- undo journal


def _undo_home(root: Path) -> Path:
    """The journal's folder, in the worktree's private git dir (``<repo>/worktrees/<name>``
    for a linked worktree): no listing, diff or commit of the work tree includes it."""
    git_dir = gitops.git(root, "rev-parse", "--absolute-git-dir").strip()
    return Path(git_dir) / UNDO_FOLDER


@contextlib.contextmanager
def _journaled(root: Path, tool_name: str, paths: Sequence[str]) -> Iterator[None]:
    """Make "what ``paths`` hold now" the undo entry, then run the body (the write). If the
    body raises (a refusal included) the previous entry comes back, so a write that did not
    happen never replaces the last good one; after the write, what each file then holds is
    noted, so that an undo can tell whether anything changed it since. ToolError, nothing
    written, when the journal cannot be saved."""
    home = _undo_home(root)
    staged = home.with_name(f"{UNDO_FOLDER}.new")
    kept = home.with_name(f"{UNDO_FOLDER}.old")
    try:
        _settle(home, kept)
        shutil.rmtree(staged, ignore_errors=True)
        entry = _save_entry(staged, root, tool_name, paths)
        if home.exists():
            home.rename(kept)
        staged.rename(home)
    except OSError as exc:
        shutil.rmtree(staged, ignore_errors=True)
        _settle(home, kept)
        raise ToolError(f"the undo journal could not be saved: {exc.strerror or exc}",
                        "Nothing was written; try again.") from None
    try:
        yield
    except BaseException:
        shutil.rmtree(home, ignore_errors=True)
        _settle(home, kept)
        raise
    shutil.rmtree(kept, ignore_errors=True)
    entry["after"] = {rel: _fingerprint(root / rel) for rel in paths}
    with contextlib.suppress(OSError):
        _write_json(home / "journal.json", entry)


def _settle(home: Path, kept: Path) -> None:
    """An entry set aside by an interrupted save comes back unless another replaced it."""
    if kept.exists():
        if home.exists():
            shutil.rmtree(kept, ignore_errors=True)
        else:
            kept.rename(home)


def _save_entry(folder: Path, root: Path, tool_name: str,
                paths: Sequence[str]) -> dict[str, Any]:
    """Write into ``folder`` (new) the entry for a write of ``paths``: a blob of each file
    that exists (its mode in the entry), none for one that does not, and the folders the
    write may create (an undo removes them again when empty)."""
    folder.mkdir(parents=True)
    files: list[dict[str, Any]] = []
    for index, rel in enumerate(paths):
        state = _file_state(root / rel)
        if state is None:
            files.append({"path": rel, "blob": None, "mode": None})
            continue
        (folder / str(index)).write_bytes(state[0])
        files.append({"path": rel, "blob": str(index),
                      "mode": (root / rel).stat().st_mode & 0o777})
    entry = {"tool": tool_name, "files": files, "folders": _missing_folders(root, paths),
             "after": None, "undone": False}
    _write_json(folder / "journal.json", entry)
    return entry


def _missing_folders(root: Path, paths: Sequence[str]) -> list[str]:
    """Folders of ``paths`` that do not exist yet, deepest first, repository-relative."""
    found: dict[str, None] = {}
    for path in paths:
        folder = (root / path).parent
        while folder != root and not folder.exists():
            found[folder.relative_to(root).as_posix()] = None
            folder = folder.parent
    return sorted(found, key=lambda name: name.count("/"), reverse=True)


def _load_entry(home: Path) -> dict[str, Any] | None:
    """The undo entry; None when there is none, ToolError when it is unreadable."""
    _settle(home, home.with_name(f"{UNDO_FOLDER}.old"))
    journal = home / "journal.json"
    if not journal.is_file():
        return None
    try:
        entry = json.loads(journal.read_text("utf-8"))
    except (OSError, ValueError):
        entry = None
    if not _entry_ok(entry):
        raise ToolError("the undo journal is unreadable; nothing was changed",
                        "Use revert with `path` to put a file back as it is at the base "
                        "commit.")
    return dict(entry)


def _entry_ok(entry: Any) -> bool:
    if not isinstance(entry, dict) or not isinstance(entry.get("tool"), str):
        return False
    files, folders, after = entry.get("files"), entry.get("folders"), entry.get("after")
    return (isinstance(files, list) and bool(files)
            and all(isinstance(item, dict) and isinstance(item.get("path"), str)
                    and isinstance(item.get("blob"), str | None)
                    and isinstance(item.get("mode"), int | None) for item in files)
            and isinstance(folders, list) and all(isinstance(f, str) for f in folders)
            and (after is None or isinstance(after, dict))
            and isinstance(entry.get("undone"), bool))


def _blob(home: Path, item: dict[str, Any]) -> bytes | None:
    if item["blob"] is None:
        return None
    try:
        return (home / PurePosixPath(item["blob"]).name).read_bytes()
    except OSError:
        raise ToolError("the undo journal is incomplete (a saved file is missing); nothing "
                        "was changed", "Use revert with `path` to put a file back as it is "
                        "at the base commit.") from None


def _entry_label(entry: dict[str, Any]) -> str:
    paths = [item["path"] for item in entry["files"]]
    shown = ", ".join(paths[:5]) + (f" and {len(paths) - 5} more" if len(paths) > 5 else "")
    return shorten(f"{entry['tool']} of {shown}", 300)


def _fingerprint(full: Path) -> str | None:
    """A file's sha256 and executable bit; None when absent, 'other' for a folder or link."""
    if full.is_symlink() or (full.exists() and not full.is_file()):
        return "other"
    state = _file_state(full)
    if state is None:
        return None
    return f"{hashlib.sha256(state[0]).hexdigest()}{'x' if state[1] else '-'}"


def _write_json(path: Path, value: Any) -> None:
    temporary = path.with_name(f"{path.name}.tmp")
    temporary.write_text(json.dumps(value), "utf-8")
    temporary.replace(path)


# --------------------------------------------------------------------------- syntax check


@dataclass(frozen=True)
class _SyntaxProblem:
    path: str
    line: int | None
    column: int | None
    message: str
    text: str

    def describe(self) -> str:
        where = f" line {self.line}" if self.line else ""
        column = f" (col {self.column})" if self.column else ""
        shown = f": {self.text}" if self.text else ""
        return f"Syntax error in {self.path}{where}: {self.message}{column}{shown}"

    def as_data(self) -> dict[str, Any]:
        return {"path": self.path, "line": self.line, "column": self.column,
                "message": self.message}


def _syntax_report(root: Path, paths: Sequence[str]) -> tuple[list[str], dict[str, Any]]:
    """Result lines and data keys for the Python files (``*.py``) a write left in ``paths``:
    each compiled, never imported or run. An error gives a line and an entry of
    ``syntax_errors``; a file over SYNTAX_MAX_BYTES (or too deeply nested to compile) is
    named in ``syntax_unchecked``. Clean files add nothing."""
    problems: list[_SyntaxProblem] = []
    unchecked: list[str] = []
    notes: list[str] = []
    for rel in paths:
        full = root / rel
        if not rel.endswith(".py") or full.is_symlink() or not full.is_file():
            continue
        if full.stat().st_size > SYNTAX_MAX_BYTES:
            unchecked.append(rel)
            notes.append(f"{rel} was not syntax-checked (over {SYNTAX_MAX_BYTES} bytes).")
            continue
        try:
            problem = _syntax_problem(rel, full.read_bytes())
        except (RecursionError, MemoryError):
            unchecked.append(rel)
            notes.append(f"{rel} was not syntax-checked (too deeply nested to compile).")
            continue
        if problem is not None:
            problems.append(problem)
    data: dict[str, Any] = {}
    if problems:
        data["syntax_errors"] = [problem.as_data() for problem in problems]
    if unchecked:
        data["syntax_unchecked"] = unchecked
    return [*(problem.describe() for problem in problems), *notes], data


def _syntax_problem(rel: str, source: bytes) -> _SyntaxProblem | None:
    """The first syntax error ``compile`` finds in ``source`` (the parser's, and the
    compiler's own such as 'return' outside a function), or None. Compiling runs nothing;
    warnings (an invalid escape...) are silenced, so a warnings-as-errors filter cannot turn
    them into errors."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compile(source, rel, "exec", dont_inherit=True)
    except SyntaxError as exc:
        return _SyntaxProblem(rel, exc.lineno, exc.offset, exc.msg,
                              _error_line(source, exc.lineno, exc.text))
    except ValueError as exc:  # Python 3.11: "source code string cannot contain null bytes"
        return _SyntaxProblem(rel, None, None, str(exc), "")
    return None


def _error_line(source: bytes, line: int | None, text: str | None) -> str:
    """The line an error names, stripped and cut; the compiler's own errors ('return'
    outside a function) carry no text, so it is taken from the source."""
    if not text and line:
        lines = source.decode("utf-8", "replace").split("\n")
        text = lines[line - 1] if line <= len(lines) else ""
    return shorten((text or "").strip().replace("\r", " ").replace("\n", " "),
                   _SHOWN_SYNTAX_CHARS)


# --------------------------------------------------------------------------- diffs


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
