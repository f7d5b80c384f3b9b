"""What every workspace tool shares about the run's worktree: a path resolved under the
boundary (never out of the worktree, never into .git, never written through a symlink), the
repository's files as ``git add --all`` sees them, and a file's bytes or state.

Contracts:

* :func:`_resolve` raises Refused for a path that leaves the worktree or names .git, and for
  a write through any symlink; ToolError for control characters.
* :func:`_read_text_bytes` gives a text file's bytes, verbatim, or a ToolError saying why not
  (a folder, missing, over MAX_READ_BYTES, binary).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path, PurePosixPath

from agents.tools.base import Refused, ToolContext, ToolError, shorten
from infraops import gitops
from reviews.diff_policy import Violation

MAX_READ_BYTES = 10_000_000  # larger files are neither read nor diffed as text
MAX_LINE_CHARS = 2_000  # a longer line is cut where a tool shows it (read_file, show_diff)
_BINARY_SNIFF_BYTES = 8_000


def _resolve(ctx: ToolContext, path: str, *, write: bool) -> tuple[str, Path]:
    """(normalised repository-relative path, absolute path) of ``path`` in the worktree.

    Refused when it leaves the worktree (absolute, '..', a symlink resolving outside),
    names .git, or, for a write, goes through any symlink (a write through a link would
    change a file the boundary check never saw).
    """
    root = ctx.worktree.resolve()
    if any(ch in path for ch in "\0\n\r"):
        raise ToolError(f"path {shorten(path)!r} contains control characters",
                         "Give a plain repository-relative path.")
    pure = PurePosixPath(path)
    if pure.is_absolute() or ".." in pure.parts:
        raise Refused([Violation(shorten(path), "leaves the repository")])
    parts = [part for part in pure.parts if part != "."]
    rel = "/".join(parts)
    if ".git" in parts:
        raise Refused([Violation(rel, "is inside .git")])
    full = root.joinpath(*parts)
    try:
        inner = full.resolve().relative_to(root).parts
    except ValueError:
        raise Refused([Violation(rel, "resolves outside the repository (symlink)")]) from None
    except (RuntimeError, OSError):
        raise Refused([Violation(rel, "cannot be resolved (symlink loop)")]) from None
    if ".git" in inner:
        raise Refused([Violation(rel, "resolves into .git (symlink)")])
    if write:
        link = _first_symlink(root, parts)
        if link is not None:
            raise Refused([Violation(rel, f"goes through the symlink {link}; symlinks are "
                                           "never written through")])
    return rel, full


def _first_symlink(root: Path, parts: Sequence[str]) -> str | None:
    probe = root
    for part in parts:
        probe = probe / part
        if probe.is_symlink():
            return probe.relative_to(root).as_posix()
    return None


def _escaping_symlinks(root: Path, paths: Sequence[str]) -> list[Violation]:
    """Symlinks on ``paths`` (or their folders) that point outside the repository."""
    found: list[Violation] = []
    for path in paths:
        probe = root
        for part in PurePosixPath(path).parts:
            probe = probe / part
            if probe.is_symlink() and not probe.resolve().is_relative_to(root):
                found.append(Violation(probe.relative_to(root).as_posix(),
                                       "is a symlink leaving the repository"))
    return found


def _repo_files(root: Path) -> list[str]:
    """Repository-relative files present in the worktree: tracked and untracked, minus
    ignored ones (what ``git add --all`` would see); never anything under .git."""
    output = gitops.git(root, "ls-files", "--cached", "--others", "--exclude-standard", "-z")
    names = dict.fromkeys(name for name in output.split("\0") if name)
    return sorted(name for name in names if (root / name).is_symlink() or (root / name).exists())


def _untracked(root: Path) -> list[str]:
    output = gitops.git(root, "ls-files", "--others", "--exclude-standard", "-z")
    return [name for name in output.split("\0") if name]


def _is_binary(raw: bytes) -> bool:
    # git's own test: a NUL byte near the start.
    return b"\0" in raw[:_BINARY_SNIFF_BYTES]


def _read_text_bytes(rel: str, full: Path) -> bytes:
    if full.is_dir():
        raise ToolError(f"{rel} is a folder", "Use list_files to see what it contains.")
    if not full.is_file():
        raise ToolError(f"{rel} does not exist", "Use list_files or search_code to find files.")
    size = full.stat().st_size
    if size > MAX_READ_BYTES:
        raise ToolError(f"{rel} is too large to read ({size} bytes)",
                         "Use search_code to find the part you need.")
    raw = full.read_bytes()
    if _is_binary(raw):
        raise ToolError(f"{rel} is a binary file ({size} bytes)",
                         "Binary files cannot be read or edited as text.")
    return raw


def _write_problems(ctx: ToolContext, path: str) -> list[Violation]:
    try:
        _resolve(ctx, path, write=True)
    except Refused as exc:
        return exc.violations
    return []


def _file_state(full: Path) -> tuple[bytes, bool] | None:
    """(bytes, executable) of a regular file; None when there is none."""
    if full.is_symlink() or not full.is_file():
        return None
    return full.read_bytes(), bool(full.stat().st_mode & 0o111)
