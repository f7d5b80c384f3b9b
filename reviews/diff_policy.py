"""Our own check of a diff before it is applied or submitted. Pure: no Django.

ARCHITECTURE.md: every path inside the editable boundaries, none under .git, no symlink
leaving the repo, no .gitattributes/.gitmodules/CI files unless allowed, size caps,
forbidden patterns never added, protected paths never touched.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

from unidiff.errors import UnidiffParseError
from unidiff.patch import PatchSet

from infraops.manifest import glob_match

ALWAYS_PROTECTED = (".git/**", ".gitattributes", ".gitmodules", "**/.gitattributes",
                    "**/.gitmodules", ".github/**", ".gitlab-ci.yml", ".ci/**")


@dataclass(frozen=True)
class Policy:
    editable: Sequence[str]
    protected: Sequence[str]
    forbidden_patterns: Sequence[str]
    max_diff_lines: int


@dataclass(frozen=True)
class Violation:
    path: str
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


def check_diff(diff: str, policy: Policy) -> list[Violation]:
    """Every reason this diff may not be applied; empty when it may."""
    try:
        patch = PatchSet(diff)
    except UnidiffParseError as exc:
        return [Violation("(diff)", f"not a unified diff: {exc}")]
    violations: list[Violation] = []
    changed = 0
    forbidden = [re.compile(p) for p in policy.forbidden_patterns]
    if not len(patch) and diff.strip():
        return [Violation("(diff)", "not a unified diff: no file header found")]
    for patched in patch:
        paths = {patched.source_file.removeprefix("a/"), patched.target_file.removeprefix("b/")}
        for path in sorted(paths - {"/dev/null"}):
            violations.extend(path_violations(path, policy))
        if "120000" in (str(patched.patch_info) if patched.patch_info else ""):
            violations.append(Violation(patched.path, "symlinks may not be created or changed"))
        for hunk in patched:
            for line in hunk:
                if line.is_added or line.is_removed:
                    changed += 1
                if line.is_added:
                    for pattern in forbidden:
                        if pattern.search(line.value):
                            violations.append(Violation(
                                patched.path,
                                f"line {line.target_line_no} matches forbidden pattern "
                                f"{pattern.pattern!r}"))
    if changed > policy.max_diff_lines:
        violations.append(Violation("(diff)", f"{changed} changed lines exceed the cap of "
                                              f"{policy.max_diff_lines}"))
    return _unique(violations)


def path_violations(path: str, policy: Policy) -> list[Violation]:
    """Why the agent may not write `path` (repository-relative), if it may not."""
    pure = PurePosixPath(path)
    if pure.is_absolute() or ".." in pure.parts:
        return [Violation(path, "leaves the repository")]
    if ".git" in pure.parts:
        return [Violation(path, "is inside .git")]
    for glob in (*ALWAYS_PROTECTED, *policy.protected):
        if glob_match(glob, path):
            return [Violation(path, f"is protected ({glob})")]
    if not any(glob_match(glob, path) for glob in policy.editable):
        return [Violation(path, "is outside the editable paths "
                                f"({', '.join(policy.editable) or 'none'})")]
    return []


def _unique(violations: list[Violation]) -> list[Violation]:
    seen: dict[tuple[str, str], Violation] = {}
    for v in violations:
        seen.setdefault((v.path, v.reason), v)
    return list(seen.values())
