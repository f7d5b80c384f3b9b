"""The one-level undo journal that ``revert`` with ``last_edit`` plays back.

Contracts:

* Every successful write (edit_file, apply_diff, revert of a file) first saves what its files
  held, in the worktree's private git dir (never in the work tree, so never in the diff or a
  commit).
* A write that does not happen (a refusal, an error) never replaces the last good entry.
* An entry that cannot be read is a ToolError, never a guess.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from agents.tools.base import ToolError, shorten
from agents.tools.workspace.worktree import _file_state
from infraops import gitops

UNDO_FOLDER = "infraops-undo"


def _undo_home(root: Path) -> Path:
    """The journal's folder, in the worktree's private git dir (``<repo>/worktrees/<name>``
    for a linked worktree): no listing, diff or commit of the work tree includes it."""
    git_dir = gitops.git(root, "rev-parse", "--absolute-git-dir").strip()
    return Path(git_dir) / UNDO_FOLDER


@contextlib.contextmanager
def _journaled(root: Path, tool_name: str, paths: Sequence[str]) -> Iterator[None]:
    """Make "what ``paths`` hold now" the undo entry, then run the body (the write). If the
    body raises (a refusal included) the previous entry comes back, so a write that did not
    happen never replaces the last good one; after the write, what each file then holds is
    noted, so that an undo can tell whether anything changed it since. ToolError, nothing
    written, when the journal cannot be saved."""
    home = _undo_home(root)
    staged = home.with_name(f"{UNDO_FOLDER}.new")
    kept = home.with_name(f"{UNDO_FOLDER}.old")
    try:
        _settle(home, kept)
        shutil.rmtree(staged, ignore_errors=True)
        entry = _save_entry(staged, root, tool_name, paths)
        if home.exists():
            home.rename(kept)
        staged.rename(home)
    except OSError as exc:
        shutil.rmtree(staged, ignore_errors=True)
        _settle(home, kept)
        raise ToolError(f"the undo journal could not be saved: {exc.strerror or exc}",
                        "Nothing was written; try again.") from None
    try:
        yield
    except BaseException:
        shutil.rmtree(home, ignore_errors=True)
        _settle(home, kept)
        raise
    shutil.rmtree(kept, ignore_errors=True)
    entry["after"] = {rel: _fingerprint(root / rel) for rel in paths}
    with contextlib.suppress(OSError):
        _write_json(home / "journal.json", entry)


def _settle(home: Path, kept: Path) -> None:
    """An entry set aside by an interrupted save comes back unless another replaced it."""
    if kept.exists():
        if home.exists():
            shutil.rmtree(kept, ignore_errors=True)
        else:
            kept.rename(home)


def _save_entry(folder: Path, root: Path, tool_name: str,
                paths: Sequence[str]) -> dict[str, Any]:
    """Write into ``folder`` (new) the entry for a write of ``paths``: a blob of each file
    that exists (its mode in the entry), none for one that does not, and the folders the
    write may create (an undo removes them again when empty)."""
    folder.mkdir(parents=True)
    files: list[dict[str, Any]] = []
    for index, rel in enumerate(paths):
        state = _file_state(root / rel)
        if state is None:
            files.append({"path": rel, "blob": None, "mode": None})
            continue
        (folder / str(index)).write_bytes(state[0])
        files.append({"path": rel, "blob": str(index),
                      "mode": (root / rel).stat().st_mode & 0o777})
    entry = {"tool": tool_name, "files": files, "folders": _missing_folders(root, paths),
             "after": None, "undone": False}
    _write_json(folder / "journal.json", entry)
    return entry


def _missing_folders(root: Path, paths: Sequence[str]) -> list[str]:
    """Folders of ``paths`` that do not exist yet, deepest first, repository-relative."""
    found: dict[str, None] = {}
    for path in paths:
        folder = (root / path).parent
        while folder != root and not folder.exists():
            found[folder.relative_to(root).as_posix()] = None
            folder = folder.parent
    return sorted(found, key=lambda name: name.count("/"), reverse=True)


def _load_entry(home: Path) -> dict[str, Any] | None:
    """The undo entry; None when there is none, ToolError when it is unreadable."""
    _settle(home, home.with_name(f"{UNDO_FOLDER}.old"))
    journal = home / "journal.json"
    if not journal.is_file():
        return None
    try:
        entry = json.loads(journal.read_text("utf-8"))
    except (OSError, ValueError):
        entry = None
    if not _entry_ok(entry):
        raise ToolError("the undo journal is unreadable; nothing was changed",
                        "Use revert with `path` to put a file back as it is at the base "
                        "commit.")
    return dict(entry)


def _entry_ok(entry: Any) -> bool:
    if not isinstance(entry, dict) or not isinstance(entry.get("tool"), str):
        return False
    files, folders, after = entry.get("files"), entry.get("folders"), entry.get("after")
    return (isinstance(files, list) and bool(files)
            and all(isinstance(item, dict) and isinstance(item.get("path"), str)
                    and isinstance(item.get("blob"), str | None)
                    and isinstance(item.get("mode"), int | None) for item in files)
            and isinstance(folders, list) and all(isinstance(f, str) for f in folders)
            and (after is None or isinstance(after, dict))
            and isinstance(entry.get("undone"), bool))


def _blob(home: Path, item: dict[str, Any]) -> bytes | None:
    if item["blob"] is None:
        return None
    try:
        return (home / PurePosixPath(item["blob"]).name).read_bytes()
    except OSError:
        raise ToolError("the undo journal is incomplete (a saved file is missing); nothing "
                        "was changed", "Use revert with `path` to put a file back as it is "
                        "at the base commit.") from None


def _entry_label(entry: dict[str, Any]) -> str:
    paths = [item["path"] for item in entry["files"]]
    shown = ", ".join(paths[:5]) + (f" and {len(paths) - 5} more" if len(paths) > 5 else "")
    return shorten(f"{entry['tool']} of {shown}", 300)


def _fingerprint(full: Path) -> str | None:
    """A file's sha256 and executable bit; None when absent, 'other' for a folder or link."""
    if full.is_symlink() or (full.exists() and not full.is_file()):
        return "other"
    state = _file_state(full)
    if state is None:
        return None
    return f"{hashlib.sha256(state[0]).hexdigest()}{'x' if state[1] else '-'}"


def _write_json(path: Path, value: Any) -> None:
    temporary = path.with_name(f"{path.name}.tmp")
    temporary.write_text(json.dumps(value), "utf-8")
    temporary.replace(path)
