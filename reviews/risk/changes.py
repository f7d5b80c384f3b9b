"""Which tokens of a hunk's changed lines the change really touched.

A diff marks whole lines; a reviewer cares about the tokens that differ. Within each run of
removed-then-added lines the token sequences of the two sides are compared: tokens present on
both sides (an unchanged ``tl.dot(M, S`` before a new ``input_precision=...``) are not part of
the change, a re-wrapped or re-indented statement changes nothing, and a run whose two sides
differ only by a consistent renaming of local names (``acc`` -> ``total`` everywhere in the
run) is a rename, not a change -- when the file's diff binds the new name (``total = ...``,
a parameter, a ``def``) and unbinds the old one: using another variable that already
existed (``hidden_bytes`` -> ``num_bytes_per_token``) looks the same in a run, and is a change.

Contract: ``changed_tokens(lines, lexed, significant, renamed)`` maps the index of every
changed line with at least one changed token to its ``LineChange``; lines it leaves out
changed nothing a signature could see. ``significant(name)`` says whether renaming ``name``
can change behaviour (``float16`` -> ``bfloat16`` is not a rename); None: the language has no
local names (configuration, shell), so no change is a rename. ``renamed(old, new)`` says
whether the file's diff binds ``new`` and unbinds ``old`` (see ``bound_names``).
"""

from __future__ import annotations

import difflib
import keyword
import re
from collections.abc import Callable, Iterator, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Protocol

from reviews.risk.diff import ADDED, CONTEXT, REMOVED, DiffLine
from reviews.risk.lexers import NAME, STRING, Lexed, Token

# Above this many token pairs a run is compared line by line first: SequenceMatcher is
# quadratic in the worst case and a 10,000-line diff must classify in well under a second.
_TOKEN_PAIRS = 40_000


@dataclass
class LineChange:
    raw: str  # the line, comments blanked
    spans: list[tuple[int, int]] = field(default_factory=list)  # changed [start, end) ranges
    code: bool = False  # a changed token other than a string literal's contents

    @property
    def norm(self) -> str:
        """The line without its layout: equal norms are the same statement."""
        return " ".join(self.raw.split())


Renamed = Callable[[str, str], bool]


def changed_tokens(lines: Sequence[DiffLine], lexed: Sequence[Lexed],
                   significant: Callable[[str], bool] | None,
                   renamed: Renamed = lambda old, new: True, *,
                   declarations: bool = True) -> dict[int, LineChange]:
    """The changed tokens of every changed line of one hunk (see the module docstring).
    ``declarations``: whether the language declares parameters by name (`f(int n)`); a shell
    or build file's arguments are all values (`add_compile_options(-DA -DB)`)."""
    out: dict[int, LineChange] = {}
    if significant is not None and (_hunk_inlined(lines, lexed) or hoisted_default(
            lines, lexed)):
        return out  # temporaries inlined or extracted, or a literal made a parameter's default
    for run in change_runs(lines):
        removed = [k for k in run if lines[k].kind != ADDED]
        added = [k for k in run if lines[k].kind == ADDED]
        _compare(removed, added, lexed, significant, renamed, out, declarations)
    return out


class _Kinded(Protocol):
    @property
    def kind(self) -> str: ...


def change_runs(lines: Sequence[_Kinded]) -> Iterator[range]:
    """The index ranges of each run of changed (non-context) lines of one hunk (diff lines,
    or any lines that carry their kind)."""
    i = 0
    while i < len(lines):
        if lines[i].kind == CONTEXT:
            i += 1
            continue
        j = i
        while j < len(lines) and lines[j].kind != CONTEXT:
            j += 1
        yield range(i, j)
        i = j


_Tok = tuple[int, Token]
# Keywords and literals look like names to the lexers; True -> False is no rename.
_NOT_NAMES = frozenset(keyword.kwlist) | frozenset(keyword.softkwlist) | {
    "true", "false", "nullptr", "NULL", "const", "static", "inline", "volatile", "unsigned",
    "signed", "int", "float", "double", "char", "long", "short", "void", "auto", "bool",
    "half", "constexpr", "extern", "register", "struct", "class", "return", "if", "else",
    "for", "while", "do", "switch", "case", "break", "continue", "goto", "sizeof", "new",
    "delete", "this", "template", "typename", "namespace", "using", "public", "private",
    "protected", "virtual", "override", "final", "noexcept", "operator",
}


# Words before which a name is an operand, not a declared parameter's name.
_OPERAND_KEYWORDS = frozenset(keyword.kwlist) | frozenset(keyword.softkwlist) | {
    "return", "sizeof", "case", "goto", "new", "delete", "throw", "co_await", "co_return"}


def normal_tokens(tokens: Sequence[_Tok], declarations: bool = True) -> list[str]:
    """The texts of a run's tokens less what compiles to the same: `NULL` is `nullptr`, an
    empty statement (the second `;` of `;;` ending a line) is nothing, and a parameter's name
    in a declaration (a name right after a type's name, before `,` or `)`:
    `f(ncclComm_t)` -> `f(ncclComm_t comm)`) names nothing that runs."""
    out: list[str] = []
    n = len(tokens)
    for i, (k, token) in enumerate(tokens):
        text = token.text
        if text == "NULL":
            text = "nullptr"
        elif text == ";" and out and out[-1] == ";" and (i + 1 == n or tokens[i + 1][0] != k):
            continue
        elif (declarations and token.kind == NAME and 0 < i < n - 1
              and tokens[i + 1][1].text in (",", ")") and text.isidentifier()
              and tokens[i - 1][0] == k == tokens[i + 1][0]):
            before = tokens[i - 1][1]
            if before.kind == NAME and before.text not in _OPERAND_KEYWORDS:
                continue
        out.append(text)
    return out


def _compare(removed: list[int], added: list[int], lexed: Sequence[Lexed],
             significant: Callable[[str], bool] | None, renamed: Renamed,
             out: dict[int, LineChange], declarations: bool = True) -> None:
    if not removed or not added:
        # New or deleted lines only: every token changed. No tokens need making (most of
        # a 10,000-line new file is this).
        for k in removed or added:
            _mark_line(k, lexed[k], out)
        return
    old = [(k, t) for k in removed for t in lexed[k].tokens]
    new = [(k, t) for k in added for t in lexed[k].tokens]
    old_text = [t.text for _, t in old]
    new_text = [t.text for _, t in new]
    if old_text == new_text or normal_tokens(old, declarations) == normal_tokens(
            new, declarations) or (
            significant is not None and _is_rename(
            old, new, significant, renamed)) or (
            ("{" in old_text or "{" in new_text or "}" in old_text or "}" in new_text)
            and _unbraced(removed, lexed) == _unbraced(added, lexed)) or (
            significant is not None and "=" in old_text + new_text and (
                _inlined(removed, added, lexed) or _inlined(added, removed, lexed))):
        return
    if len(removed) == 1 or len(added) == 1:
        if len(old) * len(new) <= _TOKEN_PAIRS:
            _mark_opcodes(old, new, out, lexed)
        else:
            _mark(old, out, lexed)
            _mark(new, out, lexed)
        return
    # Several lines a side: align lines first (an edit of n lines is n line pairs, most of
    # the time), then tokens inside each block of replaced lines. Comparing all the tokens
    # of a long run at once cost a second per 10,000 lines of a rewrite (measured).
    old_lines = [" ".join(lexed[k].raw.split()) for k in removed]
    new_lines = [" ".join(lexed[k].raw.split()) for k in added]
    matcher = difflib.SequenceMatcher(None, old_lines, new_lines, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        pairs = [(removed[i1:i2], added[j1:j2])]
        if tag == "replace" and i2 - i1 == j2 - j1:
            pairs = [([r], [a]) for r, a in zip(removed[i1:i2], added[j1:j2], strict=True)]
        for old_block, new_block in pairs:
            block_old = [(k, t) for k in old_block for t in lexed[k].tokens]
            block_new = [(k, t) for k in new_block for t in lexed[k].tokens]
            if block_old and block_new and len(block_old) * len(block_new) <= _TOKEN_PAIRS:
                _mark_opcodes(block_old, block_new, out, lexed)
            else:
                _mark(block_old, out, lexed)
                _mark(block_new, out, lexed)


def _hunk_inlined(lines: Sequence[DiffLine], lexed: Sequence[Lexed]) -> bool:
    """Whether the hunk's removed and added lines differ only by temporaries (see
    ``_inlined``) while no context line between assigns a name they compute with."""
    removed = [k for k, line in enumerate(lines) if line.kind == REMOVED]
    added = [k for k, line in enumerate(lines) if line.kind == ADDED]
    if not removed or not added or len(list(change_runs(lines))) < 2 or not (
            _maybe_temporary(removed, added, lexed) or _maybe_temporary(added, removed, lexed)):
        return False  # one run (_compare reads it), or no name defined on one side only
    # Names a context line assigns after the first changed line: an expression moved past
    # such a line computes with another value.
    first = min(removed[0], added[0])
    assigned = {name for k, line in enumerate(lines) if line.kind == CONTEXT and k > first
                for name in _ASSIGNED.findall(lexed[k].code)}
    return _inlined(removed, added, lexed, assigned) or _inlined(added, removed, lexed, assigned)


def _maybe_temporary(defined: list[int], used: list[int], lexed: Sequence[Lexed]) -> bool:
    """Whether a line of ``defined`` assigns a name the ``used`` lines never mention: a cheap
    test on the text before any token is made."""
    text = "\n".join(lexed[k].code for k in used)
    for k in defined:
        match = _ASSIGNED.match(lexed[k].code)
        if match and not re.search(rf"\b{match.group(1)}\b", text):
            return True
    return False


_ASSIGNED = re.compile(r"^\s*(?:[\w:<>*&]+\s+)*(\w+)\s*(?:[-+*/%&|^]|<<|>>)?=(?!=)")


def _inlined(defined: list[int], used: list[int], lexed: Sequence[Lexed],
             assigned: AbstractSet[str] = frozenset()) -> bool:
    """Whether the lines ``defined`` are the lines ``used`` with temporaries written apart:
    ``t = a * b`` and ``c = t + d`` on one side, ``c = a * b + d`` on the other (inlined, or,
    read the other way, extracted). The expression must stand where the name stood as the
    same tree: in brackets, or bare where no operator around it binds differently (a float
    sum regrouped is a change)."""
    target = [t.text for k in used for t in lexed[k].tokens]
    temps: dict[str, list[str]] = {}
    rest: list[str] = []
    for k in defined:
        texts = [t.text for t in lexed[k].tokens]
        name, expression = _temporary(texts)
        if name is None or name in target:  # a name the other side keeps is no temporary
            rest += texts
        elif not assigned.isdisjoint(expression):
            return False  # a name it computes with changes between definition and use
        else:
            temps[name] = expression
    if not temps or not any(name in rest for name in temps):
        return False
    return _matches_with(rest, target, temps)


def _temporary(texts: list[str]) -> tuple[str | None, list[str]]:
    """``name = expression`` (Python) or ``[const] type name = expression;`` (C): the name
    and the expression's tokens; (None, []) for any other line."""
    if "=" not in texts:
        return None, []
    at = texts.index("=")
    head, expression = texts[:at], texts[at + 1:]
    if not head or not expression or expression[0] == "=" or not head[-1].isidentifier() or (
            len(head) > 1 and not all(t.isidentifier() or t in ("*", "&", ":", "<", ">")
                                      for t in head[:-1])):
        return None, []
    if expression[-1] == ";":
        expression = expression[:-1]
    if _depths(expression)[-1] != 0:
        return None, []
    return head[-1], expression


def _matches_with(old: list[str], new: list[str], temps: dict[str, list[str]]) -> bool:
    """Whether ``old`` with each temporary replaced by its expression is ``new``."""
    i = j = 0
    while i < len(old):
        token = old[i]
        expression = temps.get(token)
        if expression is not None and (i == 0 or old[i - 1] != "."):
            n = len(expression)
            left = old[i - 1] if i else ""
            right = old[i + 1] if i + 1 < len(old) else ""
            if new[j:j + n] == expression and _bare_is_same(expression, left, right):
                i, j = i + 1, j + n
                continue
            if new[j:j + 1] == ["("] and new[j + 1:j + 1 + n] == expression and (
                    new[j + 1 + n:j + 2 + n] == [")"]):
                i, j = i + 1, j + n + 2
                continue
            return False
        if j >= len(new) or new[j] != token:
            return False
        i, j = i + 1, j + 1
    return j == len(new)


_ADDITIVE = frozenset("+-")
_MULTIPLICATIVE = frozenset("*/%@")
_OPENING = frozenset({"", "(", "[", ",", "=", "return", ":"})


def _bare_is_same(expression: list[str], left: str, right: str) -> bool:
    """Whether ``expression`` written bare between ``left`` and ``right`` parses as one
    operand (the tree the temporary made): an atom always; a product or sum only as the
    leftmost operand of an operator that binds no tighter."""
    depths = _depths(expression)
    top = {t for t, d in zip(expression, depths, strict=True) if d == 0 and not (
        t.isidentifier() or t[:1].isdigit() or t in "([.")}
    if not top:
        return True
    if top <= _MULTIPLICATIVE:
        return left in _OPENING | _ADDITIVE and right in {"", ")", "]", ",", ";"} | _ADDITIVE | (
            _MULTIPLICATIVE)
    if top <= _ADDITIVE | _MULTIPLICATIVE:
        return left in _OPENING and right in {"", ")", "]", ",", ";"} | _ADDITIVE
    return False


def _depths(tokens: list[str]) -> list[int]:
    """The bracket depth after each token."""
    out, depth = [], 0
    for t in tokens:
        depth += (t in "([{") - (t in ")]}")
        out.append(depth)
    return out


def _unbraced(indices: list[int], lexed: Sequence[Lexed]) -> list[str]:
    """The tokens of lines without a ``{`` that ends a line or a ``}`` that starts one: a
    block opened where a statement joins an ``if`` (``if (c)`` -> ``if (c) {``) changes
    nothing of its own; the statements the block gains are changes of their own lines."""
    out: list[str] = []
    for k in indices:
        texts = [t.text for t in lexed[k].tokens]
        if texts and texts[-1] == "{":
            texts.pop()
        if texts and texts[0] == "}":
            texts.pop(0)
        out += texts
    return out


def _mark_opcodes(old: list[_Tok], new: list[_Tok], out: dict[int, LineChange],
                  lexed: Sequence[Lexed]) -> None:
    if not old or not new:
        _mark(old, out, lexed)
        _mark(new, out, lexed)
        return
    matcher = difflib.SequenceMatcher(None, [t.text for _, t in old], [t.text for _, t in new],
                                      autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag != "equal":
            _mark(old[i1:i2], out, lexed)
            _mark(new[j1:j2], out, lexed)


def _mark_line(k: int, line: Lexed, out: dict[int, LineChange]) -> None:
    stripped = line.raw.strip()
    if not stripped:
        return
    start = len(line.raw) - len(line.raw.lstrip())
    out[k] = LineChange(line.raw, [(start, start + len(stripped))],
                        code=line.has_code or not line.strings)


def _mark(tokens: list[_Tok], out: dict[int, LineChange], lexed: Sequence[Lexed]) -> None:
    """Mark a run of consecutive tokens as changed: one span per line it covers."""
    previous = -1
    for k, token in tokens:
        change = out.get(k)
        if change is None:
            change = out[k] = LineChange(lexed[k].raw)
        if k == previous:
            start, _ = change.spans[-1]
            change.spans[-1] = (start, token.end)
        else:
            change.spans.append((token.start, token.end))
        previous = k
        change.code = change.code or token.kind != STRING


def _is_rename(old: list[_Tok], new: list[_Tok], significant: Callable[[str], bool],
               renamed: Renamed) -> bool:
    """Whether the two sides differ only by a consistent renaming of plain local names."""
    if len(old) != len(new) or not old:
        return False
    forward: dict[str, str] = {}
    backward: dict[str, str] = {}
    for index, ((_, a), (_, b)) in enumerate(zip(old, new, strict=True)):
        if a.text == b.text:
            continue
        if a.kind != NAME or b.kind != NAME or a.text in _NOT_NAMES or b.text in _NOT_NAMES:
            return False
        # An attribute, a method or a qualified name (x.half -> x.float, std::memory_order_*,
        # p->lock) is an API, not a local name.
        if _qualified(old, index) or _qualified(new, index):
            return False
        if forward.setdefault(a.text, b.text) != b.text or backward.setdefault(
                b.text, a.text) != a.text:
            return False
    return not any(significant(name) for pair in forward.items() for name in pair) and all(
        renamed(a, b) for a, b in forward.items())


def _qualified(tokens: list[_Tok], index: int) -> bool:
    """Whether the name at ``index`` follows ``.``, ``->`` or ``::`` (not a slice's ``:``)."""
    before = tokens[index - 1][1].text if index else ""
    return before in (".", ">") or (
        before == ":" and index > 1 and tokens[index - 2][1].text == ":")


_PY_TARGETS = re.compile(r"^\s*([A-Za-z_]\w*(?:\s*,\s*[A-Za-z_]\w*)*)\s*(?::[^=]+)?=(?!=)")
_PY_BINDERS = re.compile(r"\b(?:def|class|as|global|nonlocal)\s+([A-Za-z_]\w*)|"
                         r"\bfor\s+([A-Za-z_]\w*(?:\s*,\s*[A-Za-z_]\w*)*)\s+in\b|"
                         r"^\s*([A-Za-z_]\w*)\s*:\s*[^=]+$")
_PARAMETER = re.compile(r"[(,]\s*\**([A-Za-z_]\w*)\s*(?=[:,=)])")
_C_DECLARED = re.compile(r"(?:\b(?:auto|const|int|float|double|half|half2|bool|char|long|short|"
                         r"unsigned|signed|size_t|void|[A-Za-z_]\w*_t|[A-Z]\w*|int4|float2|float4)"
                         r"|[>*&])[\s*&]+([A-Za-z_]\w*)\s*(?=[=;,\[)(]|$)")
_C_ASSIGNED = re.compile(r"^\s*([A-Za-z_]\w*)\s*=(?!=)")


def bound_names(code: str, *, python: bool, header: bool = False) -> set[str]:
    """The names a line of code binds: assignment targets, def/class/for/as names, parameters
    of a signature (``header``), C declarations."""
    names: set[str] = set()
    if python:
        match = _PY_TARGETS.match(code)
        if match:
            names.update(part.strip() for part in match.group(1).split(","))
        for groups in _PY_BINDERS.findall(code):
            for group in groups:
                names.update(part.strip() for part in group.split(",") if part.strip())
    else:
        names.update(_C_DECLARED.findall(code))
        match = _C_ASSIGNED.match(code)
        if match:
            names.add(match.group(1))
    if header or not python:
        names.update(_PARAMETER.findall(code))
    return names


# A parameter declared on a line of its own, with a default that is a plain value:
# `dtype: torch.dtype = torch.bfloat16,` (Python) or `dtype=torch.bfloat16`.
_PARAMETER = re.compile(r"^\s*(\w+)\s*(?::\s*[\w.\[\], |]+?)?\s*=\s*([\w.]+)\s*,?\s*\)?\s*"
                        r"(?:->\s*[\w.\[\], |]+)?:?\s*$")


def hoisted_default(lines: Sequence[DiffLine], lexed: Sequence[Lexed]) -> bool:
    """Whether the hunk only makes a literal a new parameter's default: the parameter is added
    (``dtype: torch.dtype = torch.bfloat16``) and the literal, where it stood, becomes the
    parameter's name (``.to(dtype=torch.bfloat16)`` -> ``.to(dtype=dtype)``). A caller that
    passes nothing computes as before; the parameter is new, so no caller passes it yet."""
    removed = [k for k, line in enumerate(lines) if line.kind == REMOVED]
    added = [k for k, line in enumerate(lines) if line.kind == ADDED]
    if not removed or not added:
        return False
    old_code = "\n".join(lexed[k].code for k in removed)
    defaults: dict[str, list[str]] = {}
    declared: set[int] = set()
    for k in added:
        match = _PARAMETER.match(lexed[k].code)
        if match and not re.search(rf"(?<![.\w]){match.group(1)}\b(?!\s*=(?!=))", old_code) and (
                not match.group(2)[:1].isdigit()):
            defaults[match.group(1)] = [t.text for t in Lexed(match.group(2), match.group(2)
                                                               ).tokens]
            declared.add(k)
    if not defaults:
        return False
    old = [t.text for k in removed for t in lexed[k].tokens]
    new: list[str] = []
    for k in added:
        tokens = [t.text for t in lexed[k].tokens]
        if k in declared:
            if new and new[-1] == "," and (not old or old[len(new) - 1:len(new)] != [","]):
                new.pop()  # the comma the line before gained for it
            tokens = tokens[tokens.index("=") + 1 + len(defaults[tokens[0]]):]
            tokens = tokens[1:] if tokens[:1] == [","] else tokens
        for i, text in enumerate(tokens):
            if text in defaults and (i == 0 or tokens[i - 1] != ".") and (
                    tokens[i + 1:i + 2] != ["="]) and k not in declared:
                new += defaults[text]
            else:
                new.append(text)
    return new == old
