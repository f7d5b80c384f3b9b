"""A unified diff as plain data: files, hunks and numbered lines. Pure: no Django.

Contract: ``parse_diff(text)`` returns one ``FileChange`` per file of the diff, in diff order,
or raises ``DiffParseError`` (a ``ValueError``) when the text is not a unified diff. Empty text
is an empty diff. unidiff does the parsing; this module only flattens its objects into frozen
dataclasses the analysers can share without caring about unidiff's API.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from unidiff.constants import LINE_TYPE_ADDED, LINE_TYPE_CONTEXT, LINE_TYPE_REMOVED
from unidiff.errors import UnidiffParseError
from unidiff.patch import PatchSet

ADDED = "added"
REMOVED = "removed"
CONTEXT = "context"

_MODE_RE = re.compile(r"^(old|new|deleted file|new file) mode (\d+)$", re.MULTILINE)


class DiffParseError(ValueError):
    """The text is not a unified diff."""


@dataclass(frozen=True)
class DiffLine:
    kind: str  # ADDED | REMOVED | CONTEXT
    old: int | None  # line number in the old file (None for an added line)
    new: int | None  # line number in the new file (None for a removed line)
    text: str  # the line without its newline

    @property
    def number(self) -> int | None:
        """The number a finding uses: the new file's, the old file's for a removed line."""
        return self.old if self.kind == REMOVED else self.new


@dataclass(frozen=True)
class Hunk:
    section: str  # what git printed after the second @@: the enclosing function, if any
    lines: tuple[DiffLine, ...]


@dataclass(frozen=True)
class FileChange:
    path: str  # the new path; the old one for a deleted file
    old_path: str
    status: str  # "added" | "deleted" | "modified" | "renamed"
    binary: bool
    old_mode: str | None
    new_mode: str | None
    hunks: tuple[Hunk, ...]

    @property
    def mode_changed(self) -> bool:
        return self.old_mode is not None and self.new_mode is not None and (
            self.old_mode != self.new_mode)


def parse_diff(text: str) -> list[FileChange]:
    """Every file of the diff ``text``, in order. Raises DiffParseError for anything else."""
    try:
        patch = PatchSet(text)
    except UnidiffParseError as exc:
        raise DiffParseError(f"not a unified diff: {exc}") from None
    if not len(patch) and text.strip():
        raise DiffParseError("not a unified diff: no file header found")
    return [_file_change(patched) for patched in patch]


def _file_change(patched: object) -> FileChange:
    # unidiff's objects are untyped; read them through getattr in this one place.
    source = _strip_prefix(str(getattr(patched, "source_file", "") or ""))
    target = _strip_prefix(str(getattr(patched, "target_file", "") or ""))
    path = str(getattr(patched, "path", "") or target or source)
    if getattr(patched, "is_added_file", False):
        status = "added"
    elif getattr(patched, "is_removed_file", False):
        status = "deleted"
        path = source or path
    elif getattr(patched, "is_rename", False):
        status = "renamed"
    else:
        status = "modified"
    modes = {kind: mode for kind, mode in _MODE_RE.findall(str(getattr(patched, "patch_info",
                                                                       "") or ""))}
    old_mode = modes.get("old") or modes.get("deleted file")
    new_mode = modes.get("new") or modes.get("new file")
    hunks = tuple(_hunk(hunk) for hunk in patched)  # type: ignore[attr-defined]
    return FileChange(path=path, old_path=source or path, status=status,
                      binary=bool(getattr(patched, "is_binary_file", False)),
                      old_mode=old_mode, new_mode=new_mode, hunks=hunks)


def _hunk(hunk: object) -> Hunk:
    lines: list[DiffLine] = []
    kinds = {LINE_TYPE_ADDED: ADDED, LINE_TYPE_REMOVED: REMOVED, LINE_TYPE_CONTEXT: CONTEXT}
    for line in hunk:  # type: ignore[attr-defined]
        kind = kinds.get(line.line_type)
        if kind is None:  # "\ No newline at end of file"
            continue
        lines.append(DiffLine(kind, line.source_line_no, line.target_line_no,
                              line.value.rstrip("\n")))
    return Hunk(str(getattr(hunk, "section_header", "") or ""), tuple(lines))


def _strip_prefix(name: str) -> str:
    if name == "/dev/null":
        return ""
    return name[2:] if name[:2] in ("a/", "b/") else name
