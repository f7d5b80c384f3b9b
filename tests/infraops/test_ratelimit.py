"""Rate limits on run starts and approvals, counted in Redis so every web process shares them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.contrib.auth.models import User
from django.test import Client

from agents.models import AgentRun
from infraops.models import Goal
from infraops.ratelimit import APPROVE, START_RUN, rate_reset
from reviews.models import Change, ReviewDecision
from reviews.services import change_submit
from tests.reviews.conftest import SERVING_TOML, CommitOn, commit_on, config_change  # noqa: F401

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def one_long_window(settings: Any) -> None:
    # The counts are per window: one far longer than the test keeps all its calls in one.
    settings.RATE_WINDOW_SECONDS = 3600


@pytest.fixture
def fresh_counts(engineer: User, reviewer: User) -> Iterator[None]:
    """Counts left in Redis by an earlier session's user of the same id start at zero."""
    for user in (engineer, reviewer):
        for action in (APPROVE, START_RUN):
            rate_reset(user_id=user.pk, action=action)
    yield
    for user in (engineer, reviewer):
        for action in (APPROVE, START_RUN):
            rate_reset(user_id=user.pk, action=action)


def clients_of(user: User) -> list[Client]:
    """Two clients, as two browsers of one person would reach two web processes."""
    made = [Client(), Client()]
    for client in made:
        client.force_login(user)
    return made


def test_150_run_starts_against_a_limit_of_100_throttle_50_through_two_clients(
    example_goal: Goal, engineer: User, fresh_counts: None, settings: Any
) -> None:
    settings.RATE_START_RUN_PER_MIN = 100
    clients = clients_of(engineer)

    answers = [clients[n % 2].post(f"/goals/{example_goal.pk}/runs/") for n in range(150)]

    throttled = [a for a in answers if a.status_code == 429]
    started = [a for a in answers if a.status_code != 429]
    assert len(throttled) >= 50
    assert all(a.status_code == 302 and a["Location"].startswith("/runs/") for a in started)
    assert AgentRun.objects.count() == len(started) == 150 - len(throttled)
    assert "Too many run starts: at most 100" in throttled[0].content.decode()
    assert throttled[0]["Retry-After"] == "3600"
    # The count is Redis's, where any other web process reads it too.
    stored = redis.Redis.from_url(settings.REDIS_URL).get(
        f"infraops-limits:1:rate:{START_RUN}:{engineer.pk}")
    assert stored is not None and int(stored) == 150


def test_an_htmx_request_over_the_limit_gets_the_message_alone(
    example_goal: Goal, engineer: User, fresh_counts: None, settings: Any
) -> None:
    settings.RATE_START_RUN_PER_MIN = 1
    client = clients_of(engineer)[0]
    client.post(f"/goals/{example_goal.pk}/runs/")

    answer = client.post(f"/goals/{example_goal.pk}/runs/", headers={"HX-Request": "true"})

    assert answer.status_code == 429
    assert answer.content.decode().startswith('<p class="card bad" role="alert">Too many run')
    assert AgentRun.objects.count() == 1


def test_an_approval_over_the_limit_records_nothing(
    config_change: Change, commit_on: CommitOn, reviewer: User, engineer: User,  # noqa: F811
    fresh_counts: None, settings: Any
) -> None:
    settings.RATE_APPROVE_PER_MIN = 1
    base, head = commit_on({"config/serving.toml": SERVING_TOML.replace("256", "512")})
    second = change_submit(target=config_change.target, title="max_queue=512", hypothesis="h",
                           evidence={}, base_commit=base, head_commit=head,
                           author_label="run 2", requested_by=engineer, goal_version=None,
                           experiment=None)
    first_client, second_client = clients_of(reviewer)

    approved = first_client.post(f"/reviews/changes/{config_change.pk}/decide/", {
        "decision": "approve", "diff_sha256": config_change.diff_sha256})
    refused = second_client.post(f"/reviews/changes/{second.pk}/decide/", {
        "decision": "approve", "diff_sha256": second.diff_sha256})

    assert approved.status_code == 302
    assert ReviewDecision.objects.filter(change=config_change).exists()
    assert refused.status_code == 429
    assert "Too many approvals: at most 1" in refused.content.decode()
    assert not ReviewDecision.objects.filter(change=second).exists()
    second.refresh_from_db()
    assert second.status == Change.Status.PENDING_REVIEW
