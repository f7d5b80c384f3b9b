"""A diff as rows for the change page, risky lines marked with their reasons. Pure."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from unidiff.errors import UnidiffParseError
from unidiff.patch import PatchSet


@dataclass
class DiffRow:
    kind: str  # "added" | "removed" | "context" | "hunk"
    old: int | None
    new: int | None
    text: str
    risks: list[str] = field(default_factory=list)


@dataclass
class DiffFile:
    path: str
    rows: list[DiffRow]


def render_diff(diff: str, findings: list[dict[str, Any]]) -> list[DiffFile]:
    """Rows per file; a line named by a finding carries '<category>: <reason>' notes."""
    notes: dict[tuple[str, int | None, str], list[str]] = defaultdict(list)
    for f in findings:
        notes[(f["path"], f["line"], f["text"])].append(f"{f['category']}: {f['reason']}")
    try:
        patch = PatchSet(diff)
    except UnidiffParseError:
        return [DiffFile("(unparsable diff)", [DiffRow("context", None, None, diff)])]
    files = []
    for patched in patch:
        rows: list[DiffRow] = []
        for hunk in patched:
            rows.append(DiffRow("hunk", None, None, str(hunk).splitlines()[0]))
            for line in hunk:
                text = line.value.rstrip("\n")
                kind = "added" if line.is_added else "removed" if line.is_removed else "context"
                number = line.target_line_no if line.is_added else line.source_line_no
                rows.append(DiffRow(kind, line.source_line_no, line.target_line_no, text,
                                    notes.get((patched.path, number, text[:300]), [])))
        files.append(DiffFile(patched.path, rows))
    return files
