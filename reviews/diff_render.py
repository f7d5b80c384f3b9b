"""A diff as rows for the change page: syntax-highlighted, risky lines marked with their
reasons, line comments attached. Pure: no Django."""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexer import Lexer
from pygments.lexers import TextLexer, get_lexer_for_filename
from pygments.util import ClassNotFound
from unidiff.errors import UnidiffParseError
from unidiff.patch import PatchSet

# Past this many rows a diff is shown plain: highlighting costs ~0.1 ms a line.
HIGHLIGHT_MAX_ROWS = 5000
_FORMATTER = HtmlFormatter(nowrap=True, classprefix="hl-")


@dataclass
class DiffRow:
    kind: str  # "added" | "removed" | "context" | "hunk"
    old: int | None
    new: int | None
    text: str
    risks: list[str] = field(default_factory=list)
    html: str = ""  # pygments' escaped, highlighted markup of text ("" = show text plainly)
    comments: list[dict[str, Any]] = field(default_factory=list)

    @property
    def line(self) -> int | None:
        """The line a comment on this row names: new file, or old file for a removed line."""
        return self.old if self.kind == "removed" else self.new

    @property
    def side(self) -> str:
        return "old" if self.kind == "removed" else "new"


@dataclass
class DiffFile:
    path: str
    rows: list[DiffRow]
    notes: list[str] = field(default_factory=list)  # findings about the whole file


def render_diff(diff: str, findings: Sequence[dict[str, Any]],
                comments: Sequence[dict[str, Any]] = ()) -> list[DiffFile]:
    """Rows per file; a line named by a finding carries '<category>: <reason>' notes, and a
    line named by a comment ({path, line, side, ...}) carries the comment."""
    notes: dict[tuple[str, int | None, str], list[str]] = defaultdict(list)
    file_notes: dict[str, list[str]] = defaultdict(list)
    for f in findings:
        note = f"{f['category']}: {f['reason']}"
        if f.get("line") is None:
            file_notes[f["path"]].append(note)
        else:
            notes[(f["path"], f["line"], f["text"])].append(note)
    by_line: dict[tuple[str, int, str], list[dict[str, Any]]] = defaultdict(list)
    for c in comments:
        by_line[(c["path"], c["line"], c.get("side", "new"))].append(c)
    try:
        patch = PatchSet(diff)
    except UnidiffParseError:
        return [DiffFile("(unparsable diff)", [DiffRow("context", None, None, diff)])]
    files = []
    total = sum(len(hunk) for patched in patch for hunk in patched)
    for patched in patch:
        lexer = _lexer(patched.path) if total <= HIGHLIGHT_MAX_ROWS else None
        rows: list[DiffRow] = []
        for hunk in patched:
            rows.append(DiffRow("hunk", None, None, str(hunk).splitlines()[0]))
            for line in hunk:
                text = line.value.rstrip("\n")
                kind = "added" if line.is_added else "removed" if line.is_removed else "context"
                number = line.target_line_no if line.is_added else line.source_line_no
                row = DiffRow(kind, line.source_line_no, line.target_line_no, text,
                              notes.get((patched.path, number, text[:300]), []),
                              _highlight(text, lexer))
                if row.line is not None:
                    row.comments = by_line.get((patched.path, row.line, row.side), [])
                rows.append(row)
        files.append(DiffFile(patched.path, rows, file_notes.get(patched.path, [])))
    return files


def _lexer(path: str) -> Lexer | None:
    return _lexer_for_name(path.rsplit("/", 1)[-1])


@functools.lru_cache(maxsize=256)
def _lexer_for_name(name: str) -> Lexer | None:
    """The lexer of a file name, looked up once per process: pygments matches the name
    against every lexer's patterns (about 2 ms a file, on every read of a change page).
    Lexers keep no state between `highlight` calls, so one serves every thread."""
    try:
        return get_lexer_for_filename(name, stripnl=False, ensurenl=False)
    except ClassNotFound:
        return TextLexer() if "." not in name else None


def _highlight(text: str, lexer: Lexer | None) -> str:
    if lexer is None or not text:
        return ""
    return str(highlight(text, lexer, _FORMATTER)).rstrip("\n")
