"""Changed lines of one file as the analysers see them: lexed on their side of the hunk,
with their enclosing context and the tokens the change touched. Pure: no Django.

Contract: ``changed_lines(change, lexer, contexts, signatures)`` returns a ``Changed`` for
every changed line of ``change`` with at least one changed token (see ``changes``), in diff
order; ``finding`` and ``whole`` make the findings the analysers return.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache

from reviews.risk.changes import LineChange, bound_names, change_runs, changed_tokens
from reviews.risk.context import Context
from reviews.risk.diff import ADDED, CONTEXT, REMOVED, DiffLine, FileChange, Hunk
from reviews.risk.findings import MAX_TEXT, Finding
from reviews.risk.lexers import Lexed, lex_hash, lex_python
from reviews.risk.signatures import RULE_CATEGORY, Signature, SignatureSet

Ordered = tuple[tuple[int, int], Finding]
_PY_IMPORT = re.compile(r"^\s*(?:import\s|from\s+\S+\s+import\b|cimport\s|from\s+\S+\s+cimport\b)")


_C_INCLUDE = re.compile(r"^\s*#\s*(?:include|import)\b")


@dataclass
class Changed:
    """A changed line under analysis."""

    order: tuple[int, int]
    line: DiffLine
    lexed: Lexed
    change: LineChange
    context: Context
    hunk: Hunk
    is_import: bool


Contexts = Callable[[Sequence[str], Sequence[Lexed], str], list[Context]]


def changed_lines(change: FileChange, lexer: Callable[[Sequence[str]], list[Lexed]],
                   contexts: Contexts | None, signatures: SignatureSet | None,
                   ) -> list[Changed]:
    significant = _significance(signatures)
    python = lexer is lex_python
    sides = [_sides(hunk, lexer, contexts) for hunk in change.hunks]
    # Names the file's diff binds on each side: a run is a rename only if it binds the new
    # name and unbinds the old one somewhere in the file (see changes.bound_names).
    bound: dict[str, set[str]] = {ADDED: set(), REMOVED: set()}
    if significant is not None:
        for hunk, (lexed, context, _) in zip(change.hunks, sides, strict=True):
            for i, line in enumerate(hunk.lines):
                if line.kind != CONTEXT:
                    bound[line.kind] |= bound_names(lexed[i].code, python=python,
                                                    header=context[i].header)

    def renamed(old: str, new: str) -> bool:
        return new in bound[ADDED] and old in bound[REMOVED]

    out: list[Changed] = []
    for h, (hunk, (lexed, context, imported)) in enumerate(zip(change.hunks, sides,
                                                                strict=True)):
        changes = changed_tokens(hunk.lines, lexed, significant, renamed,
                                 declarations=lexer is not lex_hash)
        if python:
            _drop_annotation_changes(hunk.lines, lexed, context, changes)
        for i, line_change in sorted(changes.items()):
            out.append(Changed((h, i), hunk.lines[i], lexed[i], line_change, context[i],
                                hunk, imported[i]))
    return out


def _sides(hunk: Hunk, lexer: Callable[[Sequence[str]], list[Lexed]],
           contexts: Contexts | None) -> tuple[list[Lexed], list[Context], list[bool]]:
    """Each line of the hunk lexed, with its context and whether it is an import, as the
    side it belongs to reads it (context lines as the new side does)."""
    lexed: list[Lexed | None] = [None] * len(hunk.lines)
    context: list[Context] = [Context()] * len(hunk.lines)
    imported = [False] * len(hunk.lines)
    for side_kind in (REMOVED, ADDED):
        indices = [i for i, line in enumerate(hunk.lines)
                   if line.kind != (ADDED if side_kind == REMOVED else REMOVED)]
        texts = [hunk.lines[i].text for i in indices]
        side_lexed = lexer(texts)
        side_context = contexts(texts, side_lexed, hunk.section) if contexts else None
        imports = _imports(side_lexed) if lexer is lex_python else [
            bool(_C_INCLUDE.match(t)) for t in texts]
        for position, i in enumerate(indices):
            if hunk.lines[i].kind == side_kind or (
                    side_kind == ADDED and hunk.lines[i].kind != REMOVED):
                lexed[i] = side_lexed[position]
                if side_context is not None:
                    context[i] = side_context[position]
                imported[i] = imports[position]
    complete = [lex for lex in lexed if lex is not None]
    assert len(complete) == len(lexed)  # every line is on one side at least
    return complete, context, imported


def _drop_annotation_changes(lines: Sequence[DiffLine], lexed: Sequence[Lexed],
                             context: Sequence[Context], changes: dict[int, LineChange],
                             ) -> None:
    """A run of changed lines that only adds or edits type hints in a signature (`x` ->
    `x: torch.Tensor`, `-> torch.dtype`) changes no behaviour: forget its changes."""
    for run in change_runs(lines):
        if all(context[k].header for k in run):
            old = _without_annotations(t.text for k in run if lines[k].kind == REMOVED
                                       for t in lexed[k].tokens)
            new = _without_annotations(t.text for k in run if lines[k].kind == ADDED
                                       for t in lexed[k].tokens)
            if old == new:
                for k in run:
                    changes.pop(k, None)


def _without_annotations(pieces: Iterable[str]) -> list[str]:
    """A signature's pieces without its annotations: what follows a parameter's ':' up to
    its ',', '=' or ')', and what follows '->' up to the final ':'."""
    out: list[str] = []
    depth = 0
    skipping_at: int | None = None  # the depth an annotation started at
    previous = ""
    for piece in pieces:
        if skipping_at is not None:
            if (depth == skipping_at and piece in (",", "=", ")")) or (
                    skipping_at == 0 and piece == ":"):
                skipping_at = None
            else:
                depth += piece in "([{" and len(piece) == 1
                depth -= piece in ")]}" and len(piece) == 1
                previous = piece
                continue
        if (piece == ":" and depth == 1) or (piece == ">" and previous == "-" and depth == 0):
            if piece == ">":
                out.pop()  # the '-' of '->'
            skipping_at = depth
            previous = piece
            continue
        if len(piece) == 1 and piece in "([{":
            depth += 1
        elif len(piece) == 1 and piece in ")]}":
            depth -= 1
        out.append(piece)
        previous = piece
    return out


def _imports(lexed: Sequence[Lexed]) -> list[bool]:
    out: list[bool] = []
    inside = False
    for lex in lexed:
        if lex.depth == 0:
            inside = bool(_PY_IMPORT.match(lex.code))
        out.append(inside)
    return out


# Lower-case names that are APIs, not words a local variable is named with.
_API_NAMES = frozenset({
    "half", "float", "double", "single", "cdll", "pydll", "nogil", "expf", "exp2f", "logf",
    "log2f", "sqrtf", "rsqrtf", "rsqrt", "tanhf", "erff", "powf", "fmaf", "exp", "exp2", "log",
    "log2", "sqrt", "tanh", "sum", "mean", "softmax", "logsumexp", "matmul", "einsum", "bmm",
})


@lru_cache(maxsize=4096)
def _is_significant_in(signatures: SignatureSet, name: str) -> bool:
    """Whether renaming ``name`` can change behaviour: an API or a type (a name with a digit
    or a capital, an __intrinsic, a compound like st_release_sys_global, a known function)
    that a signature matches whole. A plain local word (`dtype`, `lock`, `_acc`) renamed
    everywhere in a run changes nothing."""
    segments = [part for part in name.split("_") if part]
    api = name in _API_NAMES or name.startswith(("__", "memory_order")) or len(segments) > 1 or any(
        c.isdigit() or c.isupper() for c in name)
    return api and any(not sig.weak and start == 0 and end == len(name)
                       for sig, start, end, _ in signatures.matches(name))


def _significance(signatures: SignatureSet | None) -> Callable[[str], bool] | None:
    """Whether renaming a name can change behaviour; None where names are not local names
    (configuration, scripts, build files: `tests/` -> `tests/unit` is no rename)."""
    if signatures is None:
        return None
    return lambda name: _is_significant_in(signatures, name)


def whole(change: FileChange, category: str, rule: str, reason: str) -> Finding:
    return Finding(category, rule, reason, change.path, None, "", "file", "")


def line_finding(change: FileChange, line: DiffLine, rule: str, category: str,
                 reason: str) -> Finding:
    """A finding on one line of the diff, read without its lexed context."""
    return Finding(category, rule, reason, change.path, line.number, line.text[:MAX_TEXT],
                   line.kind, "")


def overlaps(spans: Sequence[tuple[int, int]], start: int, end: int) -> bool:
    return any(a < end and start < b for a, b in spans)


def finding(change: FileChange, item: Changed, signature: Signature, text: str) -> Finding:
    shown = " ".join(text.split())
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    reason = signature.reason.replace("{m}", shown) if text else (
        signature.reason.replace(" ({m})", "").replace("{m}", ""))
    return Finding(RULE_CATEGORY[signature.rule], signature.rule, reason, change.path,
                   item.line.number, item.line.text[:MAX_TEXT], item.line.kind,
                   item.context.function or item.context.lock)
