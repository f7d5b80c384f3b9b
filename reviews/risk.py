"""Which lines of a diff touch numerics, concurrency or production, and why. Pure: no Django.

Built-in rules catch the common signatures (precision modes, dtypes, locks, the GIL, deploy
files); a target adds its own with [risk.<name>] tables in infraops.toml.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from unidiff.errors import UnidiffParseError
from unidiff.patch import PatchSet

from infraops.manifest import RiskRule, glob_match

NUMERICS = "numerics"
CONCURRENCY = "concurrency"
PRODUCTION = "production"


@dataclass(frozen=True)
class Rule:
    name: str
    category: str
    reason: str
    paths: tuple[str, ...] = ()  # globs: any changed line in these files matches
    patterns: tuple[str, ...] = ()  # regexes tried on each added or removed line


BUILTIN_RULES: tuple[Rule, ...] = (
    Rule("precision", NUMERICS, "changes a precision mode or numeric type",
         patterns=(r"input_precision|allow_tf32|tf32|float16|bfloat16|fp8|fp16|\bdtype\b",
                   r"\b(atol|rtol|eps|epsilon)\b")),
    Rule("accumulation", NUMERICS, "changes how values are reduced or accumulated",
         patterns=(r"\b(tl\.dot|matmul|einsum|cumsum|reduce|softmax|accumulat\w*)\b",)),
    Rule("locks", CONCURRENCY, "changes locking, threads or the GIL",
         patterns=(r"\b(Lock|RLock|Semaphore|Condition|threading|asyncio|await|async def)\b",
                   r"Py_BEGIN_ALLOW_THREADS|Py_END_ALLOW_THREADS|gil_scoped_release|nogil",
                   r"\b(atomic|mutex|__syncthreads|barrier|volatile)\b")),
    Rule("deploy", PRODUCTION, "changes deployment or serving configuration",
         paths=("deploy/**", "k8s/**", "helm/**", "**/Dockerfile", ".github/**", ".gitlab-ci.yml")),
)


@dataclass(frozen=True)
class Finding:
    category: str
    rule: str
    reason: str
    path: str
    line: int | None  # line number in the new file (old file for a removed line)
    text: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class DiffParseError(ValueError):
    """The text is not a unified diff."""


def rules_from_manifest(risk: Iterable[RiskRule]) -> tuple[Rule, ...]:
    return tuple(
        Rule(r.name, r.category, r.reason, tuple(r.paths), tuple(r.patterns)) for r in risk
    )


def classify(diff: str, rules: Sequence[Rule] = BUILTIN_RULES) -> list[Finding]:
    """Every (rule, changed line) match, in diff order; at most one finding per rule and line."""
    try:
        patch = PatchSet(diff)
    except UnidiffParseError as exc:
        raise DiffParseError(f"not a unified diff: {exc}") from None
    if not len(patch) and diff.strip():
        raise DiffParseError("not a unified diff: no file header found")
    compiled = [(rule, [re.compile(p) for p in rule.patterns]) for rule in rules]
    findings: list[Finding] = []
    for patched in patch:
        path = patched.path
        for hunk in patched:
            for line in hunk:
                if not (line.is_added or line.is_removed):
                    continue
                number = line.target_line_no if line.is_added else line.source_line_no
                text = line.value.rstrip("\n")
                for rule, patterns in compiled:
                    by_path = any(glob_match(glob, path) for glob in rule.paths)
                    if by_path or any(p.search(text) for p in patterns):
                        findings.append(Finding(rule.category, rule.name, rule.reason, path,
                                                number, text[:300]))
    return findings
