"""Our own check of a diff before it is applied or submitted. Pure: no Django.

docs/product.md ("Git"): every path inside the editable boundaries, none under .git, no symlink
leaving the repo, no .gitattributes/.gitmodules/CI files unless allowed, size caps,
forbidden patterns never added, protected paths never touched.

Decisions, for what is neither plainly allowed nor plainly out of bounds:

* Size: a diff over ``max_diff_bytes`` (1 MiB) or over ``max_files`` (200) files is refused
  on a length and a header count of the raw text, before it is parsed, so a 50 MiB diff
  costs no more than its length.
* Modes: symlinks (120000) and submodules (160000) are refused whether created, changed or
  deleted; a new executable file (100755) and any ``old mode``/``new mode`` change are
  refused too. Editing a file that is already executable is not a mode change.
* Binaries ("Binary files ... differ", ``GIT binary patch``) pass the policy within the
  size cap, their paths checked like any other: :func:`review_reasons` names them, and the
  change goes to a person (the risk classifier's "unclassified" class routes it too). The
  apply tool refuses binary patches on its own: nothing here can read what they write.
* Case: a path that differs only in case from another path of the diff, or from a path
  the repository already has (``existing``), is refused: on a case-insensitive checkout
  the two are one file.
* Paths are compared with .git, .gitmodules, .gitattributes and the protected globs
  ignoring case, and a control character (NUL included) anywhere in a path is refused.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

from unidiff.errors import UnidiffParseError
from unidiff.patch import PatchedFile, PatchSet

from infraops.manifest import glob_match

MAX_DIFF_BYTES = 1 << 20
MAX_FILES = 200

ALWAYS_PROTECTED = (".git/**", ".gitattributes", ".gitmodules", "**/.gitattributes",
                    "**/.gitmodules", ".github/**", ".gitlab-ci.yml", ".ci/**", ".gitlab/**",
                    ".circleci/**", ".travis.yml", "Jenkinsfile", "azure-pipelines.yml",
                    ".buildkite/**", ".drone.yml", "bitbucket-pipelines.yml",
                    ".pre-commit-config.yaml", ".husky/**")

EXECUTABLE_MODE = "100755"
_FILE_TYPE = 0o170000
_SYMLINK = 0o120000
_GITLINK = 0o160000

_MODE_LINE = re.compile(r"^(new file mode|deleted file mode|old mode|new mode|index \S+)"
                        r"[ \t]+(\S+)[ \t]*$", re.MULTILINE)
# git reads a mode with strtoul(..., 8): "0120000" and "+120000" are a symlink too.
_OCTAL = re.compile(r"\+?([0-7]+)")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_C_ESCAPES = {"a": 7, "b": 8, "t": 9, "n": 10, "v": 11, "f": 12, "r": 13, '"': 34, "\\": 92}
_C_ESCAPE = re.compile(r'\\([0-7]{3}|[abtnvfr"\\])')


@dataclass(frozen=True)
class Policy:
    editable: Sequence[str]
    protected: Sequence[str]
    forbidden_patterns: Sequence[str]
    max_diff_lines: int
    max_diff_bytes: int = MAX_DIFF_BYTES
    max_files: int = MAX_FILES


@dataclass(frozen=True)
class Violation:
    path: str
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


def check_diff(diff: str, policy: Policy, *, existing: Collection[str] = ()) -> list[Violation]:
    """Every reason this diff may not be applied; empty when it may.

    The byte and file caps come first, on the raw text: an oversized diff gets only its
    cap violations and is never parsed. ``existing``: the repository's paths before the
    diff (repository-relative), for the case-collision check; without it only the diff's
    own paths are compared with each other.
    """
    oversized = _size_violations(diff, policy)
    if oversized:
        return oversized
    try:
        patch = PatchSet(diff)
    except UnidiffParseError as exc:
        return [Violation("(diff)", f"not a unified diff: {exc}")]
    if not len(patch) and diff.strip():
        return [Violation("(diff)", "not a unified diff: no file header found")]
    violations: list[Violation] = []
    if len(patch) > policy.max_files:
        violations.append(Violation("(diff)", f"{len(patch)} files exceed the cap of "
                                              f"{policy.max_files} files"))
    changed = 0
    forbidden = [re.compile(p) for p in policy.forbidden_patterns]
    for patched in patch:
        source, target = _diff_path(patched.source_file, "a/"), _diff_path(patched.target_file,
                                                                          "b/")
        path = target if target != "/dev/null" else source
        for name in sorted({source, target} - {"/dev/null"}):
            violations.extend(path_violations(name, policy))
        violations.extend(_mode_violations(_printable(path), patched))
        for hunk in patched:
            for line in hunk:
                if line.is_added or line.is_removed:
                    changed += 1
                if line.is_added:
                    for pattern in forbidden:
                        if pattern.search(line.value):
                            violations.append(Violation(
                                _printable(path),
                                f"line {line.target_line_no} matches forbidden pattern "
                                f"{pattern.pattern!r}"))
    if changed > policy.max_diff_lines:
        violations.append(Violation("(diff)", f"{changed} changed lines exceed the cap of "
                                              f"{policy.max_diff_lines}"))
    violations.extend(_collisions_in(patch, existing))
    return _unique(violations)


def path_violations(path: str, policy: Policy) -> list[Violation]:
    """Why the agent may not write `path` (repository-relative), if it may not."""
    control = _CONTROL.search(path)
    if control:
        return [Violation(_printable(path), f"contains the control character "
                                            f"{_printable(control.group())}; a path must be "
                                            "printable text")]
    pure = PurePosixPath(path)
    if pure.is_absolute() or ".." in pure.parts:
        return [Violation(path, "leaves the repository")]
    # Git itself treats ".GIT" and ".git." as .git (verify_path, core.protectNTFS).
    if any(part.casefold().rstrip(". ") == ".git" for part in pure.parts):
        return [Violation(path, "is inside .git")]
    for glob in (*ALWAYS_PROTECTED, *policy.protected):
        if glob_match(glob, path) or glob_match(glob.casefold(), path.casefold()):
            return [Violation(path, f"is protected ({glob})")]
    if not any(glob_match(glob, path) for glob in policy.editable):
        return [Violation(path, "is outside the editable paths "
                                f"({', '.join(policy.editable) or 'none'})")]
    return []


def case_collisions(paths: Iterable[str], existing: Iterable[str]) -> list[Violation]:
    """Each of ``paths`` whose spelling, or one of its folders', differs only in case from
    a path in ``existing`` or from an earlier one of ``paths``; a path also in ``existing``
    is the same file, not a collision."""
    spellings: dict[str, set[str]] = {}
    for name in existing:
        for prefix in _prefixes(name):
            spellings.setdefault(prefix.casefold(), set()).add(prefix)
    found: list[Violation] = []
    for name in paths:
        for prefix in _prefixes(name):
            known = spellings.setdefault(prefix.casefold(), set())
            if known and prefix not in known:
                found.append(Violation(_printable(name), f"differs only in case from "
                                                         f"{_printable(min(known))}; on a "
                                                         "case-insensitive checkout they "
                                                         "are one file"))
                break
            known.add(prefix)
    return found


def review_reasons(diff: str) -> list[Violation]:
    """What a person must look at in a diff that passes :func:`check_diff`: binary files,
    whose content no check here reads. Cheap: only header lines are looked at."""
    found: list[Violation] = []
    current = "(diff)"
    for line in diff.splitlines():
        if line.startswith("diff --git "):
            current = _header_target(line)
        elif line.startswith("Binary files ") or line == "GIT binary patch":
            found.append(Violation(current, "is a binary file: a person must review it"))
    return _unique(found)


def _size_violations(diff: str, policy: Policy) -> list[Violation]:
    """The byte and file-count caps, read off the raw text without parsing it."""
    found: list[Violation] = []
    size, unit = len(diff), "characters"
    # A character is at least one byte, so a text longer than the cap is refused without
    # being encoded; isascii() is O(1) in CPython.
    if diff.isascii():
        unit = "bytes"
    elif size <= policy.max_diff_bytes:
        size, unit = len(diff.encode("utf-8", "surrogatepass")), "bytes"
    if size > policy.max_diff_bytes:
        found.append(Violation("(diff)", f"{size} {unit} exceed the cap of "
                                         f"{policy.max_diff_bytes} bytes; not read further"))
    files = diff.count("\ndiff --git ") + diff.startswith("diff --git ")
    if files > policy.max_files:
        found.append(Violation("(diff)", f"{files} files exceed the cap of {policy.max_files} "
                                         "files; not read further"))
    return found


def _mode_violations(path: str, patched: PatchedFile) -> list[Violation]:
    modes = dict(_MODE_LINE.findall(str(patched.patch_info or "")))
    numbers = {kind: _octal(text) for kind, text in modes.items()}
    if None in numbers.values():
        return [Violation(path, "has a mode line that is not an octal mode")]
    types = {number & _FILE_TYPE for number in numbers.values() if number is not None}
    if _SYMLINK in types:
        return [Violation(path, "symlinks may not be created or changed")]
    if _GITLINK in types:
        return [Violation(path, "submodules (gitlinks) may not be added or changed")]
    if (numbers.get("new file mode") or 0) & 0o111:
        return [Violation(path, f"would be a new executable file (mode "
                                f"{modes['new file mode']}); mode changes are refused")]
    old, new = modes.get("old mode"), modes.get("new mode")
    if old or new:
        return [Violation(path, f"changes its mode from {old or '?'} to {new or '?'}; mode "
                                "changes are refused")]
    return []


def _octal(text: str) -> int | None:
    match = _OCTAL.fullmatch(text)
    return int(match.group(1), 8) if match else None


def _collisions_in(patch: PatchSet, existing: Collection[str]) -> list[Violation]:
    present = set(existing)
    deleted = {_diff_path(f.source_file, "a/") for f in patch if f.is_removed_file}
    written = [_diff_path(f.target_file, "b/") for f in patch if not f.is_removed_file]
    return case_collisions([p for p in written if p not in present], present - deleted)


def _diff_path(name: str, prefix: str) -> str:
    """The repository path a ---/+++ name stands for: git's C-style quoting (paths with
    control or non-ASCII characters) undone, then the a/ or b/ prefix taken off."""
    return _unquoted(name).removeprefix(prefix)


def _unquoted(name: str) -> str:
    if len(name) < 2 or not (name.startswith('"') and name.endswith('"')):
        return name
    raw = bytearray()
    position = 1
    for match in _C_ESCAPE.finditer(name, 1, len(name) - 1):
        raw += name[position:match.start()].encode("utf-8", "surrogateescape")
        code = match.group(1)
        raw.append(int(code, 8) if len(code) == 3 else _C_ESCAPES[code])
        position = match.end()
    raw += name[position:len(name) - 1].encode("utf-8", "surrogateescape")
    return raw.decode("utf-8", "replace")


def _header_target(line: str) -> str:
    """The b/ path of a ``diff --git`` header, as well as it can be told apart."""
    rest = line.removeprefix("diff --git ")
    cut = rest.rfind(' "b/') if rest.endswith('"') else rest.rfind(" b/")
    return _printable(_diff_path(rest[cut + 1:], "b/")) if cut != -1 else "(diff)"


def _prefixes(path: str) -> list[str]:
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]


def _printable(text: str) -> str:
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def _unique(violations: list[Violation]) -> list[Violation]:
    seen: dict[tuple[str, str], Violation] = {}
    for v in violations:
        seen.setdefault((v.path, v.reason), v)
    return list(seen.values())
