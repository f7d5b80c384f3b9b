"""Changes on the example target, made with real commits in InfraOps' clone."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from infraops import gitops
from infraops.models import Target
from reviews.models import Change
from reviews.services import change_submit

AUTHOR = {"author_name": "InfraOps agent", "author_email": "agent@example.test"}

CommitOn = Callable[[dict[str, str]], tuple[str, str]]


@pytest.fixture(autouse=True)
def fast_password_hashing(settings: Any) -> None:
    """Users made by the fixtures get a password; the default hasher costs ~0.2 s each."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def commit_on(example_target: Target, tmp_path: Path) -> CommitOn:
    """commit_on({path: text}) commits the files on top of the clone's main tip (not moving
    main) and returns (base, head)."""
    made = 0

    def commit(files: dict[str, str]) -> tuple[str, str]:
        nonlocal made
        made += 1
        repo = example_target.clone_path
        base = gitops.rev_parse(repo, f"refs/heads/{example_target.base_branch}")
        tree = tmp_path / f"worktree-{made}"
        gitops.worktree_add(repo, tree, base)
        for name, text in files.items():
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            (tree / name).write_text(text)
        head = gitops.commit_all(tree, f"candidate {made}", **AUTHOR)
        gitops.worktree_remove(repo, tree)
        assert head is not None
        return base, head

    return commit


SERVING_TOML = "# Serving configuration of the tiny engine.\nbatch_size = 8\nmax_queue = 256\n"


@pytest.fixture
def config_change(example_target: Target, engineer: User, commit_on: CommitOn) -> Change:
    """A pending change of config/serving.toml (production risk by the example manifest),
    written by a run that `engineer` started."""
    base, head = commit_on({"config/serving.toml": SERVING_TOML})
    return change_submit(
        target=example_target, title="Tune batch_size=8", hypothesis="Bigger batches amortise.",
        evidence={}, base_commit=base, head_commit=head, author_label="run 1",
        requested_by=engineer, criteria_passed=True,
    )
