"""Which lines of a diff touch numerics, concurrency or production, and why. Pure: no Django.

Contract:

- ``classify(diff, rules=BUILTIN_RULES)`` returns every ``Finding`` of the unified diff
  ``diff``, in diff order (a file's whole-file findings before its lines), at most one per
  rule, line and side; it raises ``DiffParseError`` (a ``ValueError``) when the text is not a
  unified diff. The built-in analysis runs for the built-in rules in ``rules`` (all of
  ``BUILTIN_RULES`` by default; a subset keeps only those rules' findings); every other rule
  is a target's ``[risk.<name>]`` rule, applied as written.
- Each finding names the file, the line (None for a whole-file finding), the rule and a
  plain reason. Categories: ``numerics``, ``concurrency``, ``production`` and
  ``unclassified`` (a file the classifier cannot read: a binary, an unknown language).
- A target's rule flagging a line outranks a built-in finding of the same category on that
  line: the target knows its own files, and the category the reviewer sees is the same.
- Fast: a few regular expressions per changed line, searched only where their literals
  occur; about half a second of CPU for 10,000 lines (bench/risk_corpus.py measures it).

What is analysed, per language and class, and why: docs/risk.md.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from infraops.manifest import RiskRule, glob_match
from reviews.risk.analysers import MoveIndex, Ordered, analyse
from reviews.risk.diff import REMOVED, DiffParseError, FileChange, parse_diff
from reviews.risk.families import judged_where_used
from reviews.risk.findings import MAX_TEXT, Finding, Rule
from reviews.risk.signatures import (
    ACCUMULATION,
    ATOMICS,
    CONCURRENCY,
    DEPLOY,
    FAST_MATH,
    KERNEL,
    LAUNCH,
    LOCKS,
    NUMERICS,
    PRECISION,
    PRODUCTION,
    SERVING,
    SYNC,
    THREADS,
    UNCLASSIFIED,
    UNREADABLE,
    UNSURE,
)

__all__ = [
    "BUILTIN_RULES", "CONCURRENCY", "NUMERICS", "PRODUCTION", "UNCLASSIFIED", "DiffParseError",
    "Finding", "Rule", "classify", "risk_classes", "rules_from_manifest",
]

BUILTIN_RULES: tuple[Rule, ...] = (
    Rule(PRECISION, NUMERICS, "changes a precision mode, numeric type, quantisation or "
                              "tolerance", builtin=True),
    Rule(ACCUMULATION, NUMERICS, "changes a reduction, matmul, softmax or accumulator",
         builtin=True),
    Rule(KERNEL, NUMERICS, "changes code inside a Triton or GPU kernel", builtin=True),
    Rule(FAST_MATH, NUMERICS, "changes fast-math flags or uses approximate intrinsics",
         builtin=True),
    Rule(LOCKS, CONCURRENCY, "changes locks, critical sections or the GIL", builtin=True),
    Rule(THREADS, CONCURRENCY, "changes threads, processes, queues, events or timeouts",
         builtin=True),
    Rule(SYNC, CONCURRENCY, "changes GPU streams, barriers or collectives", builtin=True),
    Rule(ATOMICS, CONCURRENCY, "changes atomics or memory ordering", builtin=True),
    Rule(DEPLOY, PRODUCTION, "changes deployment or CI files", builtin=True),
    Rule(LAUNCH, PRODUCTION, "changes how the server is launched", builtin=True),
    Rule(SERVING, PRODUCTION, "changes serving configuration or limits", builtin=True),
    Rule(UNREADABLE, UNCLASSIFIED, "a file the classifier cannot read", builtin=True),
    Rule(UNSURE, UNCLASSIFIED, "changes a value in code that runs kernels or serves, and no "
                               "rule knows it: a reviewer decides", builtin=True),
)


def rules_from_manifest(risk: Iterable[RiskRule]) -> tuple[Rule, ...]:
    """The target's ``[risk.<name>]`` rules as classifier rules."""
    return tuple(
        Rule(r.name, r.category, r.reason, tuple(r.paths), tuple(r.patterns)) for r in risk
    )


def risk_classes(findings: Iterable[Finding]) -> list[str]:
    """The distinct categories of ``findings``, sorted."""
    return sorted({finding.category for finding in findings})


def classify(diff: str, rules: Sequence[Rule] = BUILTIN_RULES) -> list[Finding]:
    """Every finding of ``diff`` under ``rules``, in diff order (see the module docstring)."""
    changes = parse_diff(diff)
    builtin = {rule.name for rule in rules if rule.builtin}
    moves = MoveIndex(changes) if builtin and len(changes) > 1 else None
    targets = [(rule, [re.compile(p) for p in rule.patterns]) for rule in rules
               if not rule.builtin]
    findings: list[Finding] = []
    for change in changes:
        found = [(order, f) for order, f in analyse(change, moves) if f.rule in builtin] if (
            builtin) else []
        found += _target_findings(change, targets)
        findings.extend(_settle(found))
    return judged_where_used(findings) if len(changes) > 1 else findings


def _target_findings(change: FileChange,
                     targets: Sequence[tuple[Rule, list[re.Pattern[str]]]]) -> list[Ordered]:
    out: list[Ordered] = []
    for rule, patterns in targets:
        by_path = any(glob_match(glob, change.path) or glob_match(glob, change.old_path)
                      for glob in rule.paths)
        if by_path and (change.binary or not change.hunks):
            out.append(((-1, -1), Finding(rule.category, rule.name, rule.reason, change.path,
                                          None, "", "file", "")))
        for h, hunk in enumerate(change.hunks):
            for i, line in enumerate(hunk.lines):
                if line.kind not in ("added", REMOVED):
                    continue
                if by_path or any(p.search(line.text) for p in patterns):
                    out.append(((h, i), Finding(rule.category, rule.name, rule.reason,
                                                change.path, line.number,
                                                line.text[:MAX_TEXT], line.kind, "")))
    return out


def _settle(found: list[Ordered]) -> list[Finding]:
    """In diff order, one finding per rule, line and side; a target's finding outranks a
    built-in one of the same category on the same line."""
    builtin = {rule.name for rule in BUILTIN_RULES}
    targeted = {(order, f.side, f.category) for order, f in found if f.rule not in builtin}
    seen: set[tuple[tuple[int, int], str, str]] = set()
    out: list[Finding] = []
    for order, finding in sorted(found, key=lambda pair: pair[0]):
        key = (order, finding.side, finding.rule)
        if key in seen:
            continue
        if finding.rule in builtin and (order, finding.side, finding.category) in targeted:
            continue
        seen.add(key)
        out.append(finding)
    return out
