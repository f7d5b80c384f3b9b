"""Merges and approvals survive dropped database connections (issue 28, items 1 and 4;
docs/reliability.md C9): the connection is terminated inside the merge, before git moves and
after, once or on every try; the merge completes once, nothing is doubled, and a reviewer
whose decision was recorded is never answered with a 503."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from infraops import gitops
from infraops.models import AuditEntry, Target
from reviews import tasks
from reviews.models import Change, ReviewDecision
from reviews.services import changes_reap, merge
from tests.dbfaults import cutting

pytestmark = pytest.mark.django_db(transaction=True)


def _merged_once(change: Change, target: Target, main_before: str) -> None:
    """Merged, with one decision, one merge audit row and one merge commit on main."""
    change.refresh_from_db()
    assert change.status == Change.Status.MERGED, change.merge_error
    assert ReviewDecision.objects.filter(change=change).count() == 1
    assert AuditEntry.objects.filter(action="change.approve", object_id=str(change.pk)).count() == 1
    assert AuditEntry.objects.filter(action="change.merge", object_id=str(change.pk)).count() == 1
    main = gitops.rev_parse(target.clone_path, f"refs/heads/{target.base_branch}")
    assert main == change.merged_commit
    assert gitops.rev_parse(target.clone_path, f"{main}^1") == main_before


def _approve(client: Client, change: Change) -> Any:
    return client.post(f"/reviews/changes/{change.pk}/decide/",
                       {"decision": "approve", "diff_sha256": change.diff_sha256}, follow=True)


def _main(target: Target) -> str:
    return gitops.rev_parse(target.clone_path, f"refs/heads/{target.base_branch}")


def test_an_approval_whose_merge_loses_its_connection_once_merges_in_the_request(
    client: Client, reviewer: User, config_change: Change, example_target: Target,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before = _main(example_target)
    # The cut comes once the branch moved: the retry must read git's state, not move it twice.
    moved, cuts = cutting(gitops.branch_move, 1, after=True)
    monkeypatch.setattr(gitops, "branch_move", moved)
    client.force_login(reviewer)

    response = _approve(client, config_change)

    assert response.status_code == 200
    assert cuts == [1]
    assert f"Change {config_change.pk}: merged." in response.content.decode()
    _merged_once(config_change, example_target, before)


def test_an_approval_recorded_before_the_database_kept_failing_answers_the_truth_not_503(
    client: Client, reviewer: User, config_change: Change, example_target: Target,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before = _main(example_target)
    complete, cuts = cutting(merge._merge_complete, 1000)
    monkeypatch.setattr(merge, "_merge_complete", complete)
    client.force_login(reviewer)

    response = client.post(f"/reviews/changes/{config_change.pk}/decide/",
                           {"decision": "approve", "diff_sha256": config_change.diff_sha256})

    assert response.status_code == 302  # before: 503, as if nothing had been recorded
    assert len(cuts) == 3  # the request's quick reconnects, then it hands over
    config_change.refresh_from_db()
    assert config_change.status == Change.Status.MERGING
    page = client.get(response["Location"]).content.decode()
    assert (f"Change {config_change.pk}: merging; the merge is finished in the background "
            "within seconds") in page

    monkeypatch.undo()
    assert changes_reap() == [config_change.pk]  # beat's reaper, 15 s later at most
    _merged_once(config_change, example_target, before)


def test_a_merge_task_survives_its_connection_being_terminated_at_every_step(
    reviewer: User, config_change: Change, example_target: Target,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The worker's task: cut before the merge starts, once the branch moved, and inside the
    transaction that records it; each costs a reconnect, and the merge completes once."""
    from reviews.services import review_decide

    before = _main(example_target)
    with monkeypatch.context() as request_fails:  # the decision's request merges nothing
        request_fails.setattr("reviews.services.decide.change_advance", lambda **_: None)
        review_decide(change=config_change, reviewer=reviewer, decision="approve")
    config_change.refresh_from_db()
    assert config_change.status == Change.Status.MERGING
    complete, cut_complete = cutting(merge._merge_complete, 1)
    moved, cut_moved = cutting(gitops.branch_move, 1, after=True)
    recorded, cut_recorded = cutting(merge.audit_record, 1)
    monkeypatch.setattr(merge, "_merge_complete", complete)
    monkeypatch.setattr(gitops, "branch_move", moved)
    monkeypatch.setattr(merge, "audit_record", recorded)

    tasks.change_advance(config_change.pk)

    assert (cut_complete, cut_moved, cut_recorded) == ([1], [1], [1])
    _merged_once(config_change, example_target, before)
