"""The syntax check of the Python files a write left: each compiled, never imported or run.

Contract: an error is reported (a line and an entry of ``syntax_errors``), never refused: the
write stays. A file too large or too deeply nested to compile is named, not checked.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents.tools.base import shorten

SYNTAX_MAX_BYTES = 1_000_000
_SHOWN_SYNTAX_CHARS = 200


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
