"""'Request changes' reaches an agent (issue 27): the run that wrote the change gets the
comment as a message while it runs; once it ended, a run already active on the same goal gets
them as a message, else a follow-up run on the goal starts with the comments as its first
message; and the change page says which happened, or why the comments reached no agent."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from agents.models import AgentRun, RunMessage
from agents.policies.llm import _news
from infraops.models import AuditEntry, Goal, TargetMembership
from reviews.models import Change, ReviewComment, ReviewDecision
from reviews.services import requested_changes_reap, review_decide
from tests.factories import AgentRunFactory, ChangeFactory

COMMENT = "Batch 8 starves the KV transfer: try batch_size=4"


def request_changes(change: Change, reviewer: User, capture: Any,
                    comment: str = COMMENT) -> ReviewDecision:
    """Decide, then run what the commit would run (the delivery), keeping what that queues."""
    with capture(execute=False) as after_commit:
        made = review_decide(change=change, reviewer=reviewer, decision="request_changes",
                             comment=comment)
    with capture(execute=False):
        for callback in after_commit:
            callback()
    made.refresh_from_db()
    return made


def page_of(client: Client, user: User, change: Change) -> str:
    client.force_login(user)
    html = client.get(f"/reviews/changes/{change.pk}/").content.decode()
    return " ".join(html.split())


@pytest.fixture
def change_of_run(example_goal: Goal, engineer: User) -> tuple[Change, AgentRun]:
    run = AgentRunFactory.create(goal=example_goal, started_by=engineer)
    change = ChangeFactory.create(goal=example_goal, title="Tune batch_size=8",
                                  requested_by=engineer, author_label=f"run {run.pk}")
    run.changes.add(change)
    return change, run


def test_request_changes_on_a_change_whose_run_still_runs_reaches_it_as_a_message(
    change_of_run: tuple[Change, AgentRun], reviewer: User, client: Client,
    django_capture_on_commit_callbacks: Any,
) -> None:
    change, run = change_of_run

    decision = request_changes(change, reviewer, django_capture_on_commit_callbacks)

    message = RunMessage.objects.get(run=run)
    assert message.author == reviewer and message.delivered_at_step is None
    assert message.text == (f"Reviewer {reviewer.username} requested changes on change "
                            f"{change.pk} (Tune batch_size=8): {COMMENT}")
    assert decision.delivery == {"outcome": "message", "run": run.pk, "run_status": "running"}
    page = page_of(client, reviewer, change)
    assert (f'The comment went to <a href="/runs/{run.pk}/">run {run.pk}</a> (running) as a '
            "message: the agent reads it at its next step.") in page
    # An LLM agent reads it once, as the message, not a second time as the decision.
    news, _ = _news(run)
    assert [item["content"].count(COMMENT) for item in news] == [1]


def test_request_changes_after_the_run_ended_starts_a_follow_up_run_with_the_comments(
    change_of_run: tuple[Change, AgentRun], reviewer: User, engineer: User, client: Client,
    django_capture_on_commit_callbacks: Any,
) -> None:
    change, run = change_of_run
    AgentRun.objects.filter(pk=run.pk).update(status=AgentRun.Status.SUCCEEDED)
    ReviewComment.objects.create(change=change, author=reviewer, path="config/serving.toml",
                                 line=2, text="Why 8?", diff_sha256=change.diff_sha256)

    decision = request_changes(change, reviewer, django_capture_on_commit_callbacks)

    follow_up = AgentRun.objects.get(follows_change=change)
    assert follow_up.pk != run.pk and follow_up.status == AgentRun.Status.RUNNING
    assert follow_up.goal_version.goal_id == change.goal_id
    # In the first run's starter's name: the reviewer stays free to review what it submits.
    assert follow_up.started_by == engineer
    first = follow_up.messages.get()
    assert first.author == reviewer
    assert COMMENT in first.text and "- config/serving.toml line 2 (new): Why 8?" in first.text
    assert decision.delivery == {"outcome": "follow_up", "run": follow_up.pk,
                                 "run_status": "running", "ended_run": run.pk,
                                 "ended_status": "succeeded"}
    start = AuditEntry.objects.get(action="run.start", object_id=str(follow_up.pk))
    assert start.data["follows_change"] == change.pk
    assert start.data["requested_by"] == reviewer.username
    client.force_login(reviewer)
    run_page = " ".join(client.get(f"/runs/{follow_up.pk}/").content.decode().split())
    assert (f'A follow-up of <a href="/reviews/changes/{change.pk}/">change {change.pk}</a>: a '
            "reviewer requested changes") in run_page
    page = page_of(client, reviewer, change)
    assert (f'Run {run.pk} had ended (succeeded), so follow-up <a href="/runs/{follow_up.pk}/">'
            f"run {follow_up.pk}</a> started on the same goal with the comments as its first "
            "message.") in page


@pytest.mark.parametrize("status, reads", [
    (AgentRun.Status.RUNNING, "the agent reads them at its next step."),
    (AgentRun.Status.PAUSED, "the agent reads them at its next step, once the run is resumed."),
], ids=["running", "paused"])
def test_request_changes_after_the_run_ended_goes_to_a_run_already_active_on_the_goal(
    change_of_run: tuple[Change, AgentRun], reviewer: User, example_goal: Goal,
    client: Client, django_capture_on_commit_callbacks: Any, status: str, reads: str,
) -> None:
    # A follow-up beside it would compete with it for the workers, and their changes conflict.
    change, run = change_of_run
    AgentRun.objects.filter(pk=run.pk).update(status=AgentRun.Status.SUCCEEDED)
    active = AgentRunFactory.create(goal=example_goal, status=status)
    ReviewComment.objects.create(change=change, author=reviewer, path="config/serving.toml",
                                 line=2, text="Why 8?", diff_sha256=change.diff_sha256)

    decision = request_changes(change, reviewer, django_capture_on_commit_callbacks)

    assert not AgentRun.objects.filter(follows_change=change).exists()
    assert AgentRun.objects.count() == 2
    message = RunMessage.objects.get(run=active)
    assert message.author == reviewer
    assert COMMENT in message.text and "- config/serving.toml line 2 (new): Why 8?" in message.text
    assert decision.delivery == {"outcome": "message", "run": active.pk, "run_status": status,
                                 "same_goal": True, "ended_run": run.pk,
                                 "ended_status": "succeeded"}
    page = page_of(client, reviewer, change)
    assert (f'Run {run.pk} had ended (succeeded), and <a href="/runs/{active.pk}/">run '
            f"{active.pk}</a> ({status}) was already at work on the same goal, so the comments "
            "went to it as a message, not to a follow-up run that would compete with it: "
            + reads) in page


def test_a_delivery_sent_again_finds_the_follow_up_it_started_and_starts_no_second(
    change_of_run: tuple[Change, AgentRun], reviewer: User,
    django_capture_on_commit_callbacks: Any,
) -> None:
    # A process killed after the follow-up started, before the delivery was written: beat's
    # reaper sends the decision again.
    change, run = change_of_run
    AgentRun.objects.filter(pk=run.pk).update(status=AgentRun.Status.FINISHED)
    first = request_changes(change, reviewer, django_capture_on_commit_callbacks)
    ReviewDecision.objects.filter(pk=first.pk).update(
        delivery={}, created_at=timezone.now() - timedelta(minutes=6))

    with django_capture_on_commit_callbacks(execute=False):
        assert requested_changes_reap() == [first.pk]

    follow_up = AgentRun.objects.get(follows_change=change)
    assert AgentRun.objects.count() == 2
    assert follow_up.messages.count() == 1
    first.refresh_from_db()
    assert first.delivery == {"outcome": "follow_up", "run": follow_up.pk,
                              "run_status": "running", "ended_run": run.pk,
                              "ended_status": "finished"}


def test_when_no_follow_up_can_start_the_page_says_the_comments_reached_no_agent(
    change_of_run: tuple[Change, AgentRun], reviewer: User, engineer: User, client: Client,
    django_capture_on_commit_callbacks: Any,
) -> None:
    change, run = change_of_run
    AgentRun.objects.filter(pk=run.pk).update(status=AgentRun.Status.CANCELLED)
    TargetMembership.objects.filter(user=engineer).update(role="viewer")

    decision = request_changes(change, reviewer, django_capture_on_commit_callbacks)

    assert not AgentRun.objects.filter(follows_change=change).exists()
    assert decision.delivery["outcome"] == "undelivered"
    assert decision.delivery["reason"] == "Only an engineer can start a run on tiny-serving."
    page = page_of(client, reviewer, change)
    assert ("<strong>The comments reached no agent</strong>: Only an engineer can start a run "
            "on tiny-serving.") in page
    change.refresh_from_db()
    assert change.status == Change.Status.CHANGES_REQUESTED  # the decision itself stands


def test_request_changes_with_nothing_to_say_starts_no_follow_up_and_says_why(
    change_of_run: tuple[Change, AgentRun], reviewer: User,
    django_capture_on_commit_callbacks: Any,
) -> None:
    change, run = change_of_run
    AgentRun.objects.filter(pk=run.pk).update(status=AgentRun.Status.FINISHED)

    decision = request_changes(change, reviewer, django_capture_on_commit_callbacks,
                               comment="")

    assert not AgentRun.objects.filter(follows_change=change).exists()
    assert decision.delivery["outcome"] == "undelivered"
    assert "there was no comment to send" in decision.delivery["reason"]


def test_a_request_a_killed_process_left_undelivered_is_delivered_once_by_the_reaper(
    change_of_run: tuple[Change, AgentRun], reviewer: User,
    django_capture_on_commit_callbacks: Any,
) -> None:
    change, run = change_of_run
    with django_capture_on_commit_callbacks(execute=False):  # the process dies after commit
        decision = review_decide(change=change, reviewer=reviewer,
                                 decision="request_changes", comment=COMMENT)
    assert requested_changes_reap() == []  # a fresh request is its own process's to send
    ReviewDecision.objects.filter(pk=decision.pk).update(
        created_at=timezone.now() - timedelta(minutes=6))

    with django_capture_on_commit_callbacks(execute=False):
        sent = requested_changes_reap()
        again = requested_changes_reap()

    assert sent == [decision.pk] and again == []
    decision.refresh_from_db()
    assert decision.delivery == {"outcome": "message", "run": run.pk, "run_status": "running"}
    assert RunMessage.objects.filter(run=run).count() == 1
