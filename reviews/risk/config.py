"""Keys of configuration lines, for the production analysis.

Contract: ``key_paths(lines, language, section)`` returns, for each line of one hunk side, the
path of keys it sits under, outermost first, its own key last (``("engine",
"max_num_seqs")``); a line with no key of its own (a list item, a value continued from the
line above) gets its parent's path. ``normal_key`` is how keys are compared: lower case,
dashes as underscores, the last dotted or slashed component (``nvidia.com/gpu`` -> ``gpu``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from reviews.risk.files import CONFIG_ENV, CONFIG_INI, CONFIG_JSON, CONFIG_TOML, CONFIG_YAML

_YAML_KEY = re.compile(
    r"""^(\s*)(?:-\s+)?["']?([^"'\s:#{}\[\],&*!|>][^"':#{}]*?)["']?\s*:(?:\s|$)""")
_JSON_KEY = re.compile(r'^(\s*)"([^"]+)"\s*:')
_TABLE = re.compile(r"^\s*\[+\s*([^\]]+?)\s*\]+\s*$")
_ASSIGN = re.compile(r"""^\s*(?:export\s+)?["']?([\w.\-/]+)["']?\s*[=:](?!=)""")
_ENV_ASSIGN = re.compile(r"^\s*(?:export\s+)?([A-Za-z_]\w*)\s*=")


def normal_key(key: str) -> str:
    return re.split(r"[./]", key.strip().lower().replace("-", "_"))[-1]


def key_paths(lines: Sequence[str], language: str, section: str) -> list[tuple[str, ...]]:
    if language in (CONFIG_YAML, CONFIG_JSON):
        return _indented_paths(lines, _JSON_KEY if language == CONFIG_JSON else _YAML_KEY,
                               section if language == CONFIG_YAML else "")
    if language in (CONFIG_TOML, CONFIG_INI):
        return _table_paths(lines)
    if language == CONFIG_ENV:
        return [(m.group(1),) if (m := _ENV_ASSIGN.match(line)) else () for line in lines]
    return [() for _ in lines]


def _indented_paths(lines: Sequence[str], key_re: re.Pattern[str], section: str,
                    ) -> list[tuple[str, ...]]:
    stack: list[tuple[int, str]] = []
    head = key_re.match(section) if section else None
    if head and not head.group(1):
        stack.append((0, head.group(2)))  # git named the top-level key above the hunk
    out: list[tuple[str, ...]] = []
    for line in lines:
        if not line.strip() or line.lstrip().startswith(("#", "//")):
            out.append(tuple(key for _, key in stack))
            continue
        match = key_re.match(line)
        indent = len(line) - len(line.lstrip())
        if match:
            if line.lstrip().startswith("- "):
                indent += 2  # "- key: v" sits one level inside the list item
            while stack and stack[-1][0] >= indent:
                stack.pop()
            stack.append((indent, match.group(2).strip()))
            out.append(tuple(key for _, key in stack))
        else:
            while stack and stack[-1][0] > indent:
                stack.pop()
            out.append(tuple(key for _, key in stack))
    return out


def _table_paths(lines: Sequence[str]) -> list[tuple[str, ...]]:
    table: tuple[str, ...] = ()
    last_key: tuple[str, ...] = ()
    out: list[tuple[str, ...]] = []
    for line in lines:
        stripped = line.strip()
        if not stripped or stripped.startswith(("#", ";")):
            out.append(table + last_key)
            continue
        header = _TABLE.match(line)
        if header:
            table = tuple(part.strip().strip("\"'") for part in header.group(1).split("."))
            last_key = ()
            out.append(table)
            continue
        match = _ASSIGN.match(line)
        if match:
            last_key = (match.group(1),)
        out.append(table + last_key)
    return out
