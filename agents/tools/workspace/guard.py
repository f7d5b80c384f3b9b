"""A write checked as git really wrote it: the checks before writing read the diff's
headers, which git may read otherwise, so every tool that writes (edit_file, apply_diff,
revert) runs its write inside :func:`_reverted_unless_safe`.

Contract: after the body, a violation it added, a symlink, a new executable bit or a new
file differing only in case from another puts the files (and the folders the body created)
back as they were and raises Refused; so does any exception (re-raised).
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from agents.tools.base import Refused
from agents.tools.workspace.worktree import _escaping_symlinks, _repo_files
from reviews.diff_policy import EXECUTABLE_MODE, Violation, case_collisions


@contextlib.contextmanager
def _reverted_unless_safe(root: Path, paths: Sequence[str], *,
                          executable_ok: Collection[str] = ()) -> Iterator[list[Violation]]:
    """Snapshot ``paths``, run the body (which writes them and may add violations to the
    yielded list), then check them as git really wrote them: no symlink leaving the
    repository, no new executable bit (except on ``executable_ok``: files a revert puts back
    as executable as they are at the base commit), no new file differing only in case from
    another (the checks before writing read the diff's headers, which git may read
    otherwise). On any violation or exception the files and the folders the body created are
    put back, and Refused (or the exception) is raised."""
    saved = _Snapshot.take(root, paths)
    violations: list[Violation] = []
    try:
        yield violations
        violations += _escaping_symlinks(root, paths)
        violations += saved.new_problems(root, executable_ok=executable_ok)
    except BaseException:
        saved.restore()
        raise
    if violations:
        saved.restore()
        raise Refused(violations)


@dataclass
class _Snapshot:
    files: dict[Path, tuple[bytes, int] | None]
    new_folders: list[Path]

    @classmethod
    def take(cls, root: Path, paths: Sequence[str]) -> _Snapshot:
        files: dict[Path, tuple[bytes, int] | None] = {}
        folders: dict[Path, None] = {}
        for path in paths:
            full = root / path
            files[full] = (full.read_bytes(), full.stat().st_mode) if full.is_file() else None
            folder = full.parent
            while folder != root and not folder.exists():
                folders[folder] = None
                folder = folder.parent
        return cls(files, sorted(folders, key=lambda f: len(f.parts), reverse=True))

    def new_problems(self, root: Path, *,
                     executable_ok: Collection[str] = ()) -> list[Violation]:
        """Symlinks, executable bits (outside ``executable_ok``) and case collisions that the
        write brought in."""
        found: list[Violation] = []
        created: list[str] = []
        for full, saved in self.files.items():
            rel = full.relative_to(root).as_posix()
            if full.is_symlink():
                found.append(Violation(rel, "symlinks may not be created or changed"))
            if full.is_symlink() or not full.is_file():
                continue
            was_executable = saved is not None and bool(saved[1] & 0o111)
            if full.stat().st_mode & 0o111 and not was_executable and rel not in executable_ok:
                found.append(Violation(rel, f"would be executable (mode {EXECUTABLE_MODE}); "
                                            "mode changes are refused"))
            if saved is None:
                created.append(rel)
        if created:
            others = [name for name in _repo_files(root) if name not in created]
            found += case_collisions(created, others)
        return found

    def restore(self) -> None:
        for full, saved in self.files.items():
            if full.is_symlink() or (full.exists() and not full.is_dir()):
                full.unlink()
            if saved is not None:
                full.parent.mkdir(parents=True, exist_ok=True)
                full.write_bytes(saved[0])
                full.chmod(saved[1] & 0o7777)
        for folder in self.new_folders:
            with contextlib.suppress(OSError):
                folder.rmdir()
