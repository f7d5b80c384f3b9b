"""Merging as one outcome: intent first, git outside the transaction, finished after a crash;
races between reviewers; re-verification when the base moved; conflicts."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import psutil
import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.db import close_old_connections, connection
from django.utils import timezone

from infraops import gitops
from infraops.errors import DomainError
from infraops.models import AuditEntry, Experiment, Target
from reviews.models import Change, ReviewDecision
from reviews.services import (
    change_advance,
    change_merge_request,
    changes_reap,
    review_decide,
)
from tests.conftest import UserFactory
from tests.e2e.conftest import system_env
from tests.infraops.workers_harness import wait_until
from tests.reviews.conftest import CommitOn, criterion_finding, origin_moved

pytestmark = pytest.mark.django_db(transaction=True)


def spec_of(change: Change) -> dict[str, Any]:
    assert change.goal_version is not None
    return change.goal_version.spec


def tip(repo: Path) -> str:
    return gitops.rev_parse(repo, "refs/heads/main")


def move_main(target: Target, commit_on: CommitOn, files: dict[str, str]) -> str:
    base, other = commit_on(files)
    return gitops.merge(target.clone_path, branch="main", commit=other, expected_base=base,
                        message="other work", author_name="Someone",
                        author_email="someone@example.test")


# --- a web process killed during the push -----------------------------------------------------

_APPROVE_AND_HANG = """
import sys, django
django.setup()
from django.contrib.auth.models import User
from infraops import gitops
from reviews.models import Change
from reviews.services import review_decide
gitops._HOOKLESS_RECEIVE_PACK = sys.argv[3]
review_decide(change=Change.objects.get(pk=int(sys.argv[1])),
              reviewer=User.objects.get(pk=int(sys.argv[2])), decision="approve",
              comment="Ship it.")
"""


def test_a_process_killed_during_the_push_leaves_a_merge_a_restart_finishes_once(
    config_change: Change, reviewer: User, example_target: Target, tmp_path: Path
) -> None:
    marker = tmp_path / "push-started"
    slow = tmp_path / "slow-receive-pack"
    slow.write_text(f"#!/bin/sh\ntouch {marker}\nsleep 120\n"
                    'exec git -c core.hooksPath=/dev/null receive-pack "$@"\n')
    slow.chmod(0o755)
    origin = Path(example_target.repo_url)
    origin_before = tip(origin)
    child = subprocess.Popen(
        [sys.executable, "-c", _APPROVE_AND_HANG, str(config_change.pk), str(reviewer.pk),
         str(slow)], env=system_env(Path(settings.DATA_DIR)), cwd=settings.BASE_DIR)
    try:
        wait_until(marker.exists, timeout=120, what="the push to start")
    finally:
        # kill -9 the whole tree at once: the web process, git push and the receive-pack.
        tree = [psutil.Process(child.pid), *psutil.Process(child.pid).children(recursive=True)]
        for process in tree:
            process.kill()
        child.wait(timeout=30)

    config_change.refresh_from_db()
    assert config_change.status == Change.Status.MERGING
    intent = config_change.merge_intent
    assert tip(origin) == origin_before
    assert ReviewDecision.objects.filter(change=config_change, decision="approve").count() == 1
    assert AuditEntry.objects.filter(action="change.approve",
                                     object_id=str(config_change.pk)).count() == 1

    assert changes_reap() == [config_change.pk]  # the restart: beat's reaper
    assert changes_reap() == []

    config_change.refresh_from_db()
    assert config_change.status == Change.Status.MERGED
    assert config_change.merged_commit == intent["commit"]
    assert tip(origin) == tip(example_target.clone_path) == intent["commit"]
    assert ReviewDecision.objects.filter(change=config_change).count() == 1
    merges = AuditEntry.objects.filter(action="change.merge", object_id=str(config_change.pk))
    assert [(m.actor_label, m.data["commit"]) for m in merges] == [("rae", intent["commit"])]


def test_advancing_a_merged_change_again_changes_nothing(config_change: Change,
                                                         reviewer: User) -> None:
    review_decide(change=config_change, reviewer=reviewer, decision="approve")
    config_change.refresh_from_db()
    merged = config_change.merged_commit
    entries = AuditEntry.objects.count()

    again = change_advance(change_id=config_change.pk)

    assert (again.status, again.merged_commit) == (Change.Status.MERGED, merged)
    assert AuditEntry.objects.count() == entries


# --- races -------------------------------------------------------------------------------------

def _at_once(*calls: Callable[[], Any]) -> list[BaseException | None]:
    """Run the calls in threads released together; each on its own database connection."""
    barrier = threading.Barrier(len(calls))
    outcomes: list[BaseException | None] = [None] * len(calls)

    def run(index: int, call: Callable[[], Any]) -> None:
        try:
            barrier.wait(timeout=30)
            call()
        except BaseException as exc:
            outcomes[index] = exc
        finally:
            close_old_connections()
            connection.close()

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return outcomes


@pytest.mark.parametrize("trial", range(20))
def test_two_reviewers_deciding_at_once_make_exactly_one_decision(
    config_change: Change, reviewer: User, trial: int
) -> None:
    other = cast(User, UserFactory(username=f"rob{trial}", roles=["reviewer"]))
    first, second = ("approve", "reject") if trial % 2 else ("reject", "approve")

    outcomes = _at_once(
        lambda: review_decide(change=Change.objects.get(pk=config_change.pk), reviewer=reviewer,
                              decision=first),
        lambda: review_decide(change=Change.objects.get(pk=config_change.pk), reviewer=other,
                              decision=second))

    refused = [o for o in outcomes if o is not None]
    assert len(refused) == 1 and isinstance(refused[0], DomainError), outcomes
    assert "already decided" in str(refused[0])
    config_change.refresh_from_db()
    assert ReviewDecision.objects.filter(change=config_change).count() == 1
    decision = ReviewDecision.objects.get(change=config_change).decision
    assert config_change.status == (Change.Status.MERGED if decision == "approve"
                                    else Change.Status.REJECTED)
    assert AuditEntry.objects.filter(action="change.merge").count() == (decision == "approve")


def _approved_but_merge_failed(change: Change, reviewer: User, example_target: Target,
                               tmp_path: Path) -> None:
    """Approve while the origin has moved (the push is refused), then put the origin back."""
    with origin_moved(example_target, tmp_path):
        review_decide(change=change, reviewer=reviewer, decision="approve")
    change.refresh_from_db()
    assert change.status == Change.Status.MERGE_FAILED, change.merge_error


@pytest.mark.parametrize("trial", range(20))
def test_a_double_clicked_merge_merges_once(config_change: Change, reviewer: User,
                                            example_target: Target, tmp_path: Path,
                                            trial: int) -> None:
    _approved_but_merge_failed(config_change, reviewer, example_target, tmp_path)

    outcomes = _at_once(*(lambda: change_merge_request(
        change=Change.objects.get(pk=config_change.pk), user=reviewer) for _ in range(2)))

    config_change.refresh_from_db()
    assert config_change.status == Change.Status.MERGED, (outcomes, config_change.merge_error)
    assert AuditEntry.objects.filter(action="change.merge").count() == 1
    parents = gitops.git(example_target.clone_path, "show", "--no-patch", "--format=%P",
                         config_change.merged_commit).split()
    assert parents == [config_change.base_commit, config_change.head_commit]
    assert tip(Path(example_target.repo_url)) == config_change.merged_commit


# --- the base moved ----------------------------------------------------------------------------

def _finish(experiment: Experiment, findings: list[dict[str, Any]]) -> None:
    Experiment.objects.filter(pk=experiment.pk).update(
        status=Experiment.Status.SUCCEEDED, finished_at=timezone.now(),
        feedback={"findings": findings, "counts": {}, "agent_text": ""})


def test_a_moved_base_is_re_verified_and_the_merged_tree_merges_when_it_passes(
    passing_submit: Callable[..., Change], example_target: Target, commit_on: CommitOn
) -> None:
    old = tip(example_target.clone_path)
    moved = move_main(example_target, commit_on, {"README.md": "Someone else's edit.\n"})
    change = Change.objects.get(pk=passing_submit(on=old).pk)
    assert [c["name"] for c in change.failing_checks] == ["base"]
    assert change.status == Change.Status.REVERIFYING
    rv = change.reverify_experiment
    assert rv is not None and rv.baseline_commit == moved
    assert rv.criteria == spec_of(change)["criteria"]  # the acceptance probes

    assert changes_reap() == []  # still running: nothing moves
    _finish(rv, [criterion_finding(spec_of(change)["criteria"][0])])
    assert changes_reap() == [change.pk]

    change.refresh_from_db()
    assert change.status == Change.Status.MERGED
    assert change.merged_commit == rv.candidate_commit
    assert tip(example_target.clone_path) == rv.candidate_commit
    parents = gitops.git(example_target.clone_path, "show", "--no-patch", "--format=%P",
                         change.merged_commit).split()
    assert parents == [moved, change.head_commit]


def test_a_failed_re_verification_sends_the_change_back_to_review_with_the_reason(
    passing_submit: Callable[..., Change], example_target: Target, commit_on: CommitOn,
    reviewer: User
) -> None:
    old = tip(example_target.clone_path)
    moved = move_main(example_target, commit_on, {"README.md": "Someone else's edit.\n"})
    change = passing_submit(on=old)
    rv = Change.objects.get(pk=change.pk).reverify_experiment
    assert rv is not None
    spec = spec_of(change)["criteria"][0]
    _finish(rv, [criterion_finding(spec, passed=False, detail="candidate vs baseline +1.0%")])

    changes_reap()

    change.refresh_from_db()
    assert change.status == Change.Status.PENDING_REVIEW
    assert f"re-verification on main at {moved[:10]}" in change.merge_error
    assert "+1.0%" in change.merge_error
    assert tip(example_target.clone_path) == moved

    # A reviewer who approves after seeing the failure takes the decision on themselves.
    review_decide(change=change, reviewer=reviewer, decision="approve")
    change.refresh_from_db()
    assert change.status == Change.Status.MERGED
    assert change.merged_commit == rv.candidate_commit


def test_a_base_that_moves_between_the_intent_and_the_branch_move_is_re_verified(
    passing_submit: Callable[..., Change], example_target: Target, commit_on: CommitOn
) -> None:
    change = passing_submit()
    assert change.status == Change.Status.MERGING
    moved = move_main(example_target, commit_on, {"README.md": "Someone else's edit.\n"})

    change = change_advance(change_id=change.pk)

    assert change.status == Change.Status.REVERIFYING
    assert change.reverify_experiment is not None
    assert change.reverify_experiment.baseline_commit == moved
    assert tip(example_target.clone_path) == moved


def test_a_change_that_conflicts_with_the_moved_base_ends_in_conflict_and_merges_nothing(
    config_change: Change, reviewer: User, example_target: Target, commit_on: CommitOn
) -> None:
    text = "# Serving configuration of the tiny engine.\nbatch_size = 4\nmax_queue = 256\n"
    moved = move_main(example_target, commit_on, {"config/serving.toml": text})

    review_decide(change=config_change, reviewer=reviewer, decision="approve")

    config_change.refresh_from_db()
    assert config_change.status == Change.Status.CONFLICT
    assert "conflicts with it in config/serving.toml" in config_change.merge_error
    assert tip(example_target.clone_path) == moved
    assert config_change.merged_commit == ""
    assert not Experiment.objects.filter(origin__startswith="re-verify").exists()


# --- the diff the reviewer saw ------------------------------------------------------------------

def test_a_decision_on_a_diff_other_than_the_one_shown_is_refused(config_change: Change,
                                                                 reviewer: User) -> None:
    with pytest.raises(DomainError, match="The diff changed since you opened it"):
        review_decide(change=config_change, reviewer=reviewer, decision="approve",
                      diff_sha256="0" * 64)

    config_change.refresh_from_db()
    assert config_change.status == Change.Status.PENDING_REVIEW
    assert not ReviewDecision.objects.exists()
    assert tip(config_change.target.clone_path) == config_change.base_commit
