"""Line lexers for hunk fragments: which characters of a line are code, comment or string.

A hunk is a fragment: it may start inside a docstring, a block comment or an open bracket, so
the languages' own tokenizers (``tokenize`` raises on most fragments) cannot be used as they
are. These lexers carry their state across the lines of one side of a hunk and never fail.

Contract: ``lex_<language>(lines)`` returns one ``Lexed`` per input line, in order, with
``code`` and ``raw`` exactly as long as the line: comments are blanked in both, string
contents are masked with ``_`` in ``code`` and kept in ``raw``. Signatures search ``code`` so
that a log message saying "float16" or a comment saying "lock" never matches. ``tokens`` (the
words, numbers, strings and punctuation the change comparison works on) are made on first
use: most lines of a diff are context and never need them.
"""

from __future__ import annotations

import keyword
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

NAME = "name"
NUMBER = "number"
STRING = "string"
OP = "op"


class Token(NamedTuple):
    # A NamedTuple, not a dataclass: a 10,000-line diff makes 100,000 of them.
    kind: str
    start: int
    end: int
    text: str


_CODE_TOKEN = re.compile(r"(?P<name>[A-Za-z_]\w*)|(?P<number>\d[\w.]*)|(?P<op>[^\s\w])")
_CONFIG_TOKEN = re.compile(r"(?P<name>--?[A-Za-z][\w.-]*|[A-Za-z_][\w./-]*)|(?P<number>\d[\w.]*)"
                           r"|(?P<op>[^\s\w])")
_KINDS = {"name": NAME, "number": NUMBER, "op": OP}


@dataclass
class Lexed:
    """One line as the lexer saw it."""

    code: str
    raw: str
    strings: tuple[tuple[int, int], ...] = ()  # string literals' [start, end) in the line
    depth: int = 0  # open brackets at the start of the line: >0 means a continuation line
    starts_in_string: bool = False
    words: re.Pattern[str] = field(default=_CODE_TOKEN, repr=False)
    _tokens: list[Token] | None = field(default=None, repr=False)
    _has_code: bool | None = field(default=None, repr=False)

    @property
    def tokens(self) -> list[Token]:
        """Words, numbers, string literals (whole) and punctuation, in line order."""
        if self._tokens is None:
            tokens: list[Token] = []
            position = 0
            for start, end in (*self.strings, (len(self.raw), len(self.raw))):
                for match in self.words.finditer(self.code, position, start):
                    tokens.append(Token(_KINDS[match.lastgroup or "op"], match.start(),
                                        match.end(), match.group()))
                if end > start:
                    tokens.append(Token(STRING, start, end, self.raw[start:end]))
                position = end
            self._tokens = tokens
        return self._tokens

    @property
    def has_code(self) -> bool:
        """Whether the line holds code: not blank, not a comment, not a docstring (a line of
        strings alone counts only inside brackets, where it is an argument)."""
        if self._has_code is None:
            self._has_code = self._find_code()
        return self._has_code

    def _find_code(self) -> bool:
        if not self.strings:
            return bool(self.code.strip())
        position = 0
        for start, end in self.strings:
            if self.code[position:start].strip():
                return True
            position = end
        return bool(self.code[position:].strip()) or self.depth > 0


Lexer = Callable[[Sequence[str]], list[Lexed]]

_OPENERS = "([{"
_CLOSERS = ")]}"


def _depth_change(code: str) -> int:
    return (code.count("(") + code.count("[") + code.count("{")
            - code.count(")") - code.count("]") - code.count("}"))


def _string_end(line: str, i: int, quote: str) -> int | None:
    """The index just past the closing ``quote`` at or after ``i``, None if not on this line."""
    j = i
    while True:
        k = line.find(quote, j)
        if k < 0:
            return None
        backslashes = 0
        while k - 1 - backslashes >= i and line[k - 1 - backslashes] == "\\":
            backslashes += 1
        if backslashes % 2 == 0:
            return k + len(quote)
        j = k + 1


class _Line:
    """A line being lexed: blanks and masks applied to copies of it."""

    __slots__ = ("code", "line", "raw", "strings")

    def __init__(self, line: str) -> None:
        self.line = line
        self.code: list[str] | None = None
        self.raw: list[str] | None = None
        self.strings: list[tuple[int, int]] = []

    def blank(self, start: int, end: int) -> None:
        if self.code is None:
            self.code, self.raw = list(self.line), list(self.line)
        assert self.raw is not None
        self.code[start:end] = self.raw[start:end] = " " * (end - start)

    def string(self, start: int, end: int, inner_start: int, inner_end: int, *,
               mask: bool = True) -> None:
        self.strings.append((start, end))
        if mask and inner_end > inner_start:
            if self.code is None:
                self.code, self.raw = list(self.line), list(self.line)
            self.code[inner_start:inner_end] = "_" * (inner_end - inner_start)

    def done(self, depth: int, starts_in_string: bool,
             words: re.Pattern[str] = _CODE_TOKEN) -> Lexed:
        code = self.line if self.code is None else "".join(self.code)
        raw = self.line if self.raw is None else "".join(self.raw)
        return Lexed(code, raw, tuple(self.strings), depth, starts_in_string, words)


# --- Python ----------------------------------------------------------------------------------

_PY_SPECIAL = re.compile(r"#|'''|\"\"\"|'|\"")
# Two identifiers side by side with only a space between them never occur in Python code
# (keywords aside): such a line is prose, the inside of a docstring the hunk started in.
_PY_KEYWORDS = frozenset(keyword.kwlist) | frozenset(keyword.softkwlist) | {
    # Cython declarations read like two names in a row.
    "cdef", "cpdef", "ctypedef", "cimport", "nogil", "gil", "int", "float", "double", "long",
    "char", "unsigned", "signed", "const", "struct", "extern", "inline", "public", "readonly",
    "noexcept", "bint", "object", "void", "size_t", "short", "print", "exec",
}
_ADJACENT_NAMES = re.compile(r"\b([A-Za-z_]\w*) +([A-Za-z_]\w*)\b(?![(\[.=])")


def looks_like_prose(code: str) -> bool:
    """Whether a line lexed as Python code reads as English: two non-keyword names in a row
    (not an attribute followed by a name: `x.y if z`), or a backtick, which Python 3 code never
    has and reStructuredText and Markdown docstrings quote names in."""
    if "`" in code:
        return True
    for match in _ADJACENT_NAMES.finditer(code):
        first, second = match.group(1), match.group(2)
        if first in _PY_KEYWORDS or second in _PY_KEYWORDS:
            continue
        if match.start() and code[match.start() - 1] == ".":
            continue
        return True
    return False


def lex_python(lines: Sequence[str]) -> list[Lexed]:
    """Python (and Cython) lines. A fragment whose first triple quote closes a docstring the
    hunk started in is lexed as starting inside that string; prose lines are not code, nor
    the examples a docstring shows (a Markdown fence's lines, doctest prompts)."""
    first = _python(lines, None)
    prose = [line.has_code and looks_like_prose(line.code) for line in first]
    for i in _docstring_examples(first, prose):
        prose[i] = True
    # A fragment read as ending inside a string, whose first triple quote stands alone on its
    # line, may start inside a docstring instead: that quote closes it (a hunk that opens on
    # a docstring's last line, its code below otherwise read as one string).
    unclosed = bool(first) and first[-1].starts_in_string and bool(
        _LONE_QUOTE.match(next((line for line in lines if _TRIPLE.search(line)), "")))
    opener = _first_triple_quote(lines) if any(prose) or unclosed else None
    if opener is not None:
        second = _python(lines, opener)
        second_prose = [line.has_code and looks_like_prose(line.code) for line in second]
        if sum(second_prose) < sum(prose) or (unclosed and not second[-1].starts_in_string
                                              and sum(second_prose) <= sum(prose)):
            first, prose = second, second_prose
    for i, is_prose in enumerate(prose):
        if is_prose:
            blank = " " * len(first[i].code)
            first[i] = Lexed(blank, blank, (), first[i].depth, first[i].starts_in_string)
    return first


_TRIPLE = re.compile(r"'''|\"\"\"")
_LONE_QUOTE = re.compile(r"^\s*[rRbBuU]?(?:'''|\"\"\")\s*$")
# A line Python code never starts with: a Markdown code fence, a doctest prompt.
_FENCE = re.compile(r"^\s*```")
_DOCTEST = re.compile(r"^\s*(?:>>>|\.\.\.)(?: |$)(?!\s*$)|^\s*>>>\s*$")


def _docstring_examples(lexed: Sequence[Lexed], prose: Sequence[bool]) -> list[int]:
    """The lines of a hunk side that are examples inside a docstring: doctest lines, and the
    lines between two Markdown fences (one fence alone opens an example if prose comes before
    it in the hunk, else it closes one the hunk started in)."""
    if not any("```" in line.code or ">>>" in line.code or "..." in line.code
               for line in lexed):
        return []
    out = [i for i, line in enumerate(lexed) if _DOCTEST.match(line.code)]
    fences = [i for i, line in enumerate(lexed) if _FENCE.match(line.code)]
    if len(fences) % 2:
        first = fences[0]
        fences = ([first, len(lexed)] if any(prose[:first]) else [-1, first]) + fences[1:]
    for start, end in zip(fences[::2], fences[1::2], strict=True):
        out += range(max(start, 0), min(end + 1, len(lexed)))
    return out


def _first_triple_quote(lines: Sequence[str]) -> str | None:
    for line in lines:
        match = re.search(r"'''|\"\"\"", line)
        if match:
            return match.group()
    return None


def _python(lines: Sequence[str], in_string: str | None) -> list[Lexed]:
    out: list[Lexed] = []
    depth = 0
    for text in lines:
        line = _Line(text)
        starts_in_string, start_depth = in_string is not None, depth
        n, pos = len(text), 0
        if in_string is not None:  # the rest of a string opened on a line above
            end = _string_end(text, 0, in_string)
            stop = n if end is None else end
            line.string(0, stop, 0, stop if end is None else stop - len(in_string))
            pos = stop
            if end is not None or (len(in_string) == 1 and not text.endswith("\\")):
                in_string = None
        while in_string is None:
            match = _PY_SPECIAL.search(text, pos)
            if match is None:
                break
            start, quote = match.start(), match.group()
            if quote == "#":
                line.blank(start, n)
                break
            begin = start  # a string prefix (rb"", f"") belongs to the literal
            while begin > 0 and start - begin < 2 and text[begin - 1] in "rRbBfFuU":
                begin -= 1
            if begin < start and begin > 0 and (text[begin - 1].isalnum() or (
                    text[begin - 1] == "_")):
                begin = start
            end = _string_end(text, match.end(), quote)
            if end is None:
                line.string(begin, n, match.end(), n)
                if len(quote) == 3 or text.endswith("\\"):
                    in_string = quote
                break
            line.string(begin, end, match.end(), end - len(quote))
            pos = end
        lexed = line.done(start_depth, starts_in_string)
        depth = max(0, depth + _depth_change(lexed.code))
        out.append(lexed)
    return out


# --- C, C++, CUDA and shader languages ---------------------------------------------------------

# Inline PTX (asm volatile("ld.acquire.gpu.b32 ...")) is code written in a string; a printf
# format or a log message is not. PTX strings start with an instruction and its modifiers.
_PTX = re.compile(r"\s*\{?\s*(?:@!?%?\w+\s+)?[a-z][a-z0-9]*(?:\.[a-z0-9_:]+)+\b")
_C_COMMENT_CONTINUATION = re.compile(r"^\s*\*(?:\s|/|$)")
_C_SPECIAL = re.compile(r"//|/\*|\"|'")


def lex_c(lines: Sequence[str]) -> list[Lexed]:
    """C, C++, CUDA, HIP, Metal, GLSL and OpenCL lines: // and /* */ comments, string and
    character literals; inline PTX strings stay visible in ``code``."""
    out: list[Lexed] = []
    in_comment = False
    depth = 0
    for text in lines:
        line = _Line(text)
        n, pos = len(text), 0
        if not in_comment and _C_COMMENT_CONTINUATION.match(text) and not text.rstrip(
        ).endswith((";", "{", "}", ")", ",")):
            in_comment = True  # the hunk started inside a /* ... */ block
        while pos < n:
            if in_comment:
                end = text.find("*/", pos)
                stop = n if end < 0 else end + 2
                line.blank(pos, stop)
                pos, in_comment = stop, end < 0
                continue
            match = _C_SPECIAL.search(text, pos)
            if match is None:
                break
            start, special = match.start(), match.group()
            if special == "//":
                line.blank(start, n)
                break
            if special == "/*":
                in_comment, pos = True, start
                continue
            if special == "'" and start and text[start - 1].isalnum():
                pos = start + 1  # a digit separator (1'000) or a suffix, not a character
                continue
            closing = _string_end(text, start + 1, special)
            stop = n if closing is None else closing
            ptx = special == '"' and bool(_PTX.match(text, start + 1))
            line.string(start, stop, start + 1, stop if closing is None else stop - 1,
                        mask=not ptx)
            pos = stop
        lexed = line.done(depth, False)
        depth = max(0, depth + _depth_change(lexed.code))
        out.append(lexed)
    return out


# --- Configuration, shell, build files ---------------------------------------------------------

_HASH_SPECIAL = re.compile(r"#|//|\"|'")


def lex_hash(lines: Sequence[str], *, hashes: bool = True, slashes: bool = False,
             semicolons: bool = False) -> list[Lexed]:
    """Shell, YAML, TOML, INI, .env, Dockerfile, CMake, Make and HCL lines: '#' comments
    (at the start of a line or after a blank, outside quotes), one-line quoted strings kept
    as they are (``code`` equals ``raw``). ``hashes`` False: no '#' comments (JSON);
    ``slashes`` adds // comments (HCL, JSON with comments), ``semicolons`` ; comments (INI)."""
    out: list[Lexed] = []
    for text in lines:
        line = _Line(text)
        n, pos = len(text), 0
        if semicolons and text.lstrip().startswith(";"):
            line.blank(0, n)
            pos = n
        while pos < n:
            match = _HASH_SPECIAL.search(text, pos)
            if match is None:
                break
            start, special = match.start(), match.group()
            if special == "#":
                if hashes and (start == 0 or text[start - 1].isspace()):
                    line.blank(start, n)
                    break
                pos = start + 1
                continue
            if special == "//":
                if slashes and (start == 0 or text[start - 1] in " \t,"):
                    line.blank(start, n)
                    break
                pos = start + 2
                continue
            end = _string_end(text, start + 1, special)
            stop = n if end is None else end
            line.string(start, stop, start + 1, stop, mask=False)
            pos = stop
        out.append(line.done(0, False, _CONFIG_TOKEN))
    return out


def lex_json(lines: Sequence[str]) -> list[Lexed]:
    """JSON lines, and JSON with // comments as editors' settings files are."""
    return lex_hash(lines, hashes=False, slashes=True)
