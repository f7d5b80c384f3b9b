"""The ``search_code`` tool: a Python regular expression over the repository's text files.

Contract: a search is bounded in files, bytes, matches and time (SEARCH_*), and the result
says where it stopped; a pattern that could backtrack exponentially is refused as an argument
error before anything is read.
"""

from __future__ import annotations

import contextlib
import importlib
import re
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from agents.tools.base import ArgumentError, ToolContext, ToolResult, bounded, tool
from agents.tools.schema import obj, string
from agents.tools.workspace.worktree import _is_binary, _repo_files
from infraops.manifest import glob_match

MAX_PATTERN_CHARS = 200
SEARCH_MAX_FILES = 5_000
SEARCH_MAX_BYTES = 20_000_000
SEARCH_MAX_FILE_BYTES = 1_000_000
SEARCH_MAX_MATCHES = 200
SEARCH_LINE_CHARS = 1_000
SEARCH_SECONDS = 5.0
_SHOWN_MATCH_CHARS = 300


@tool(
    "search_code",
    "Regex search: path:line: text.",
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
