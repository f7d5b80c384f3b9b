"""A target's clone follows its upstream: a refresh (and each run's start, which refreshes)
brings the upstream base branch into the clone, so the manifest and goals shown are those at
its head. Fast-forward, keep what was merged here, merge both, or name the conflict."""

from __future__ import annotations

from pathlib import Path

import pytest

from infraops import gitops
from infraops.errors import DomainError
from infraops.models import Target
from infraops.services.targets import target_refresh_manifest

pytestmark = pytest.mark.django_db
WHO = {"author_name": "U", "author_email": "u@example.test"}


def commit_on(repo: Path, branch: str, work: Path, files: dict[str, str]) -> str:
    """A commit on `branch` of the bare `repo` writing `files`; the branch moves to it."""
    tip = gitops.rev_parse(repo, f"refs/heads/{branch}")
    gitops.worktree_add(repo, work, tip)
    for name, text in files.items():
        (work / name).write_text(text)
    made = gitops.commit_all(work, f"edit {', '.join(files)}", **WHO)
    gitops.worktree_remove(repo, work)
    assert made is not None
    gitops.branch_move(repo, branch, new=made, old=tip)
    return made


def manifest_with_timeout(target: Target, seconds: int) -> str:
    assert "\ntimeout = 60\n" in target.manifest_text
    return target.manifest_text.replace("\ntimeout = 60\n", f"\ntimeout = {seconds}\n", 1)


def test_a_refresh_fast_forwards_to_the_upstream_head(example_target: Target,
                                                      tmp_path: Path) -> None:
    origin = Path(example_target.repo_url)
    upstream = commit_on(origin, "main", tmp_path / "w",
                         {"infraops.toml": manifest_with_timeout(example_target, 90)})

    refreshed = target_refresh_manifest(target=example_target)

    assert refreshed.manifest_commit == upstream
    assert gitops.rev_parse(example_target.clone_path, "refs/heads/main") == upstream
    assert "\ntimeout = 90\n" in refreshed.manifest_text


def test_what_was_merged_here_stays_and_both_histories_meet(example_target: Target,
                                                             tmp_path: Path) -> None:
    clone, origin = example_target.clone_path, Path(example_target.repo_url)
    mine = commit_on(clone, "main", tmp_path / "a", {"NOTES.md": "merged by InfraOps\n"})
    assert target_refresh_manifest(target=example_target).manifest_commit == mine  # ahead: kept
    upstream = commit_on(origin, "main", tmp_path / "b", {"UPSTREAM.md": "pushed upstream\n"})

    refreshed = target_refresh_manifest(target=example_target)

    tip = refreshed.manifest_commit
    assert tip not in (mine, upstream)
    assert gitops.is_ancestor(clone, mine, tip) and gitops.is_ancestor(clone, upstream, tip)
    assert gitops.read_file(clone, tip, "NOTES.md") == b"merged by InfraOps\n"
    assert gitops.read_file(clone, tip, "UPSTREAM.md") == b"pushed upstream\n"


def test_a_conflict_with_upstream_is_named_and_moves_nothing(example_target: Target,
                                                             tmp_path: Path) -> None:
    clone, origin = example_target.clone_path, Path(example_target.repo_url)
    mine = commit_on(clone, "main", tmp_path / "a", {"README.md": "ours\n"})
    commit_on(origin, "main", tmp_path / "b", {"README.md": "theirs\n"})

    with pytest.raises(DomainError, match=r"conflict in README\.md: resolve it upstream"):
        target_refresh_manifest(target=example_target)
    assert gitops.rev_parse(clone, "refs/heads/main") == mine
