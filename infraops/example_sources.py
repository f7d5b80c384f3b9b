"""Example targets built from a pinned public release: ``examples/NAME/source.toml``.

An example folder may hold, beside its own files, a ``source.toml`` naming the installed
distributions whose packages make up the rest of the target, and the edits that turn that
release into the example's base (``manage.py load_example`` commits the result)::

    [[distribution]]
    name = "fla-core"                  # as pip knows it
    version = "0.6.0"                  # the installed version must be exactly this
    packages = ["fla"]                 # its top-level packages copied into the tree

    [[edit]]                           # applied in order, after the copy
    file = "fla/ops/cp/chunk_merge.py" # repo-relative, a file of the built tree
    old = "..."                        # must occur exactly once in the file
    new = "..."
    why = "..."                        # goes into the initial commit's message

Contracts:

- ``source_parse(text)`` returns an ``ExampleSource`` or raises ``ExampleSourceError`` listing
  every problem with its line (best effort), table and field, as the manifest's parser does
  (``infraops/manifest.py``, whose TOML reading it shares).
- ``tree_build`` copies only what the installed distribution's RECORD lists, and refuses a
  file whose sha256 differs from it: a modified install is not the pinned release. The
  distribution's license files go to ``LICENSES/<name>/``.
- No Django and no subprocess: the module reads the installed distributions
  (``importlib.metadata``) and writes the folder it is given.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import re
import shutil
import textwrap
import tomllib
from collections.abc import Callable
from importlib import metadata
from pathlib import Path, PurePosixPath
from typing import NoReturn

from infraops.errors import DomainError

# The TOML reading of the feedback contract's parser, shared so that both files report their
# problems alike: the same line finding, the same wording for keys, strings and paths.
from infraops.manifest import (
    ManifestProblem,
    _array_of_tables,
    _check_keys,
    _Locator,
    _relative_path_problem,
    _strings,
    _syntax_problem,
    _Table,
    _table_for,
    _text,
)

SOURCE_FILE = "source.toml"
LICENSES = "LICENSES"
# requirements-gpu.txt pins the releases the bundled examples name, with their hashes.
INSTALL_COMMAND = "pip install --require-hashes --no-deps -r requirements-gpu.txt"
REINSTALL_COMMAND = INSTALL_COMMAND.replace("install", "install --force-reinstall", 1)

TOP_LEVEL_KEYS = ("distribution", "edit")
DISTRIBUTION_KEYS = ("name", "version", "packages")
EDIT_KEYS = ("file", "old", "new", "why")

# PEP 508's project names; a top-level package is an identifier.
_DISTRIBUTION_RE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?")
_PACKAGE_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class ExampleSourceError(DomainError):
    """source.toml is malformed, or the tree it describes cannot be built as it says."""


@dataclasses.dataclass(frozen=True)
class Release:
    """One ``[[distribution]]``: the packages of an installed distribution at a version."""

    name: str
    version: str
    packages: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.name} {self.version}"


@dataclasses.dataclass(frozen=True)
class Edit:
    """One ``[[edit]]``: ``old`` replaced by ``new`` in ``file``, for the reason ``why``."""

    file: str
    old: str
    new: str
    why: str


@dataclasses.dataclass(frozen=True)
class ExampleSource:
    releases: tuple[Release, ...]
    edits: tuple[Edit, ...]


# --- Reading source.toml -------------------------------------------------------------------


def source_read(folder: Path) -> ExampleSource | None:
    """The folder's source.toml, parsed; None when it has none (the folder is the example)."""
    path = folder / SOURCE_FILE
    if not path.is_file():
        return None
    try:
        return source_parse(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise ExampleSourceError(f"{SOURCE_FILE} is not UTF-8 text: {exc}") from None


def source_parse(text: str) -> ExampleSource:
    """Parse and validate a source.toml; raise ExampleSourceError naming every problem."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        _raise([_syntax_problem(exc, text)])
    except (ValueError, RecursionError) as exc:
        _raise([ManifestProblem("(top level)", None, None, f"cannot read this TOML: {exc}")])
    locator = _Locator(text)
    problems: list[ManifestProblem] = []
    root = _Table(label="(top level)", locator=locator, span=locator.root(), header=None,
                  problems=problems)
    _check_keys(data, TOP_LEVEL_KEYS, root, "top-level key")
    releases = _releases(data.get("distribution"), root, locator)
    edits = _edits(data.get("edit"), root, locator)
    if problems:
        _raise(problems)
    return ExampleSource(releases=releases, edits=edits)


def _raise(problems: list[ManifestProblem]) -> NoReturn:
    ordered = sorted(problems, key=lambda p: (p.line is None, p.line or 0))
    raise ExampleSourceError(f"{SOURCE_FILE}: " + "; ".join(map(str, ordered)))


def _releases(raw: object, root: _Table, locator: _Locator) -> tuple[Release, ...]:
    example = ' with name = "fla-core", version = "0.6.0", packages = ["fla"]'
    tables = _array_of_tables(raw, "distribution", root, example)
    if not tables and raw in (None, []):
        root.report("distribution", "there is no [[distribution]] table: name the release "
                                    f"the example is built from,{example}")
    releases: list[Release] = []
    for index, table in tables:
        report = _table_for(root, locator, ("distribution",), f"distribution[{index}]", index)
        before = report.count()
        _check_keys(table, DISTRIBUTION_KEYS, report, "distribution key")
        name = _text(table, "name", report, required=True)
        if name is not None and not _DISTRIBUTION_RE.fullmatch(name):
            report.report("name", f"name {name!r} is not a distribution name as pip knows it")
        if name is not None and any(r.name == name for r in releases):
            report.report("name", f"{name!r} is named by an earlier [[distribution]] too")
        version = _text(table, "version", report, required=True)
        packages = _strings(table, "packages", report, what="top-level package", required=True,
                            shape=(_PACKAGE_RE, "a top-level package name, e.g. 'fla'"))
        if report.count() == before and name is not None and version is not None:
            releases.append(Release(name=name, version=version, packages=packages))
    return tuple(releases)


def _edits(raw: object, root: _Table, locator: _Locator) -> tuple[Edit, ...]:
    edits: list[Edit] = []
    for index, table in _array_of_tables(raw, "edit", root, ' with file, old, new and why'):
        report = _table_for(root, locator, ("edit",), f"edit[{index}]", index)
        before = report.count()
        _check_keys(table, EDIT_KEYS, report, "edit key")
        file = _text(table, "file", report, required=True)
        problem = _relative_path_problem(file, glob=False) if file is not None else None
        if problem is not None:
            report.report("file", f"file {file!r} {problem}")
        old = _text(table, "old", report, required=True)
        new = _text(table, "new", report, required=False)
        if "new" not in table:
            report.report("new", "new is required (the text that replaces old; it may be empty)")
        why = _text(table, "why", report, required=True)
        if report.count() == before and None not in (file, old, new, why):
            edits.append(Edit(file=str(file), old=str(old), new=str(new), why=str(why)))
    return tuple(edits)


# --- The installed releases ----------------------------------------------------------------


def release_problem(release: Release) -> str | None:
    """Why the installed distribution is not ``release`` (with the command that installs it);
    None when the pinned version is installed."""
    try:
        installed = metadata.version(release.name)
    except metadata.PackageNotFoundError:
        return f"{release.name} is not installed: run `{INSTALL_COMMAND}`"
    if installed != release.version:
        return (f"{release.name} {installed} is installed, but the example is built from "
                f"{release.version}: run `{INSTALL_COMMAND}`")
    return None


def source_problem(source: ExampleSource) -> str | None:
    """The first release of ``source`` that is not installed as pinned, and why; or None."""
    return next(filter(None, map(release_problem, source.releases)), None)


# --- Building the tree ---------------------------------------------------------------------


def tree_build(*, example: Path, source: ExampleSource, dest: Path) -> None:
    """Make in the empty folder ``dest`` the tree an example's repository starts from: the
    example's own files but source.toml, each release's packages and license files as
    installed (every file checked against its RECORD), then the edits, in order.

    Raises ExampleSourceError, naming the release or file, when a release is not installed
    as pinned, an installed file differs from its RECORD, a release file would replace one of
    the example's, or an edit's old text does not occur exactly once.
    """
    shutil.copytree(example, dest, symlinks=True, dirs_exist_ok=True,
                    ignore=_own_files_only(example))
    for release in source.releases:
        problem = release_problem(release)
        if problem is not None:
            raise ExampleSourceError(problem)
        _copy_release(metadata.distribution(release.name), release, dest)
    for number, edit in enumerate(source.edits, start=1):
        _apply_edit(dest, number, edit)


def commit_message(name: str, source: ExampleSource) -> str:
    """The initial commit's message: what the tree was built from, and why each edit."""
    releases = ", ".join(f"{r} ({', '.join(r.packages)})" for r in source.releases)
    body = textwrap.fill(
        f"The example's own files (examples/{name}) and the packages of the installed "
        "release, each file checked against the release's RECORD; its licenses are in "
        f"{LICENSES}/.", width=72)
    lines = [f"{name}: the bundled example, built from {releases}", "", body]
    if source.edits:
        lines += ["", "Edits to the release:"]
        lines += [textwrap.fill(f"- {edit.file}: {edit.why}", width=72, subsequent_indent="  ")
                  for edit in source.edits]
    return "\n".join(lines) + "\n"


def _own_files_only(top: Path) -> Callable[[str, list[str]], set[str]]:
    """copytree's filter: no source.toml at the top, no byte code anywhere."""
    def ignore(folder: str, names: list[str]) -> set[str]:
        skipped = {n for n in names if n == "__pycache__" or n.endswith(".pyc")}
        if Path(folder) == top:
            skipped.add(SOURCE_FILE)
        return skipped
    return ignore


def _copy_release(dist: metadata.Distribution, release: Release, dest: Path) -> None:
    files = dist.files
    if files is None:
        raise ExampleSourceError(f"the installed {release} has no RECORD, so its files cannot "
                                 f"be checked: run `{REINSTALL_COMMAND}`")
    copied = dict.fromkeys(release.packages, 0)
    for path in files:
        if path.parts[0] in copied and not _is_bytecode(path):
            _copy_verified(dist, release, path, dest / path.as_posix())
            copied[path.parts[0]] += 1
    missing = [package for package, count in copied.items() if count == 0]
    if missing:
        raise ExampleSourceError(f"the installed {release} has no package "
                                 f"{', '.join(missing)}: check packages in {SOURCE_FILE}")
    licenses = _license_files(dist)
    if not licenses:
        raise ExampleSourceError(f"the installed {release} holds no license file in its "
                                 "dist-info: its code is not copied without one")
    for path, name in licenses:
        _copy_verified(dist, release, path, dest / LICENSES / release.name / name)


def _is_bytecode(path: PurePosixPath) -> bool:
    return "__pycache__" in path.parts or path.suffix == ".pyc"


def _license_files(dist: metadata.Distribution) -> list[tuple[metadata.PackagePath, str]]:
    """The license files in the dist-info, each with its name under LICENSES/<name>/: those
    in ``licenses/`` (PEP 639), or at the top of the dist-info as older wheels put them,
    named by License-File."""
    named = set(dist.metadata.get_all("License-File") or [])
    found = []
    for path in dist.files or ():
        if len(path.parts) < 2 or not path.parts[0].endswith(".dist-info"):
            continue
        inside = PurePosixPath(*path.parts[1:])
        if inside.parts[0] == "licenses" and len(inside.parts) > 1:
            found.append((path, PurePosixPath(*inside.parts[1:]).as_posix()))
        elif inside.as_posix() in named:
            found.append((path, inside.as_posix()))
    return found


def _copy_verified(dist: metadata.Distribution, release: Release, path: metadata.PackagePath,
                   target: Path) -> None:
    """Copy one installed file to ``target`` if its bytes are those its RECORD names."""
    shown = path.as_posix()
    if ".." in path.parts:
        raise ExampleSourceError(f"the RECORD of the installed {release} names {shown}, "
                                 "outside the packages it lists")
    if path.hash is None or path.hash.mode != "sha256":
        raise ExampleSourceError(f"the RECORD of the installed {release} gives no sha256 for "
                                 f"{shown}, so it cannot be checked: run `{REINSTALL_COMMAND}`")
    installed = Path(str(dist.locate_file(path)))
    try:
        data = installed.read_bytes()
    except OSError:
        raise ExampleSourceError(f"{shown} of the installed {release} is missing "
                                 f"({installed}): run `{REINSTALL_COMMAND}`") from None
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    if digest != path.hash.value:
        raise ExampleSourceError(f"{shown} of the installed {release} differs from the "
                                 f"release (its sha256 is not the one in RECORD): a modified "
                                 f"install is not the pinned release; run `{REINSTALL_COMMAND}`")
    if target.exists() or target.is_symlink():
        raise ExampleSourceError(f"{shown} of {release} is also one of the example's own files: "
                                 f"change the release with an [[edit]] in {SOURCE_FILE} instead")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)  # the bytes checked, not a second read
    shutil.copymode(installed, target)


def _apply_edit(tree: Path, number: int, edit: Edit) -> None:
    """Bytes, not text: a file's line endings and encoding stay the release's."""
    path = tree / edit.file
    if not path.is_file() or path.is_symlink():
        raise ExampleSourceError(f"edit[{number}] of {SOURCE_FILE}: {edit.file} is not a file "
                                 "of the built tree")
    data, old = path.read_bytes(), edit.old.encode()
    count = data.count(old)
    if count != 1:
        raise ExampleSourceError(f"edit[{number}] of {SOURCE_FILE}: its old text occurs {count} "
                                 f"times in {edit.file}; it must occur exactly once")
    path.write_bytes(data.replace(old, edit.new.encode(), 1))
