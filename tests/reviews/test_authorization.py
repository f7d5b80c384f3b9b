"""Who may do what on a change, through real HTTP requests: 0 unexpected allows or denies.

Roles by actions. The agent has no account: it reaches the site, if at all, as an anonymous
client. Every refused attempt by a signed-in person answers 403 and leaves an audit row."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client

from infraops.models import AuditEntry, Target
from reviews.models import Change, ReviewComment, ReviewDecision, ReviewerProfile
from reviews.services import review_decide
from tests.conftest import UserFactory
from tests.reviews.conftest import origin_moved

ROLES = ["viewer", "engineer", "run-starter", "reviewer-of-another-class", "reviewer", "admin",
         "agent"]
ACTIONS = ["view", "approve", "reject", "request_changes", "merge", "comment"]
MAY_DECIDE = {"reviewer", "admin"}
ALLOWED = {(role, "view") for role in ROLES if role != "agent"} | {
    (role, action) for role in MAY_DECIDE for action in ACTIONS}
# A reviewer of another class may still comment on a line: a comment decides nothing.
ALLOWED |= {("reviewer-of-another-class", "comment"), ("run-starter", "comment")}


def actor(role: str, change: Change) -> User | None:
    if role == "agent":
        return None
    if role == "run-starter":
        starter = cast(User, change.requested_by)
        starter.groups.add(Group.objects.get_or_create(name="reviewer")[0])
        return starter
    if role == "admin":
        return User.objects.create_superuser("ada", "ada@example.test", "pw")
    roles = {"viewer": ["viewer"], "engineer": ["engineer"], "reviewer": ["reviewer"],
             "reviewer-of-another-class": ["reviewer"]}[role]
    user = cast(User, UserFactory(username=f"u-{role}", roles=roles))
    if role == "reviewer-of-another-class":
        ReviewerProfile.objects.create(user=user, risk_classes=["numerics", "concurrency"])
    return user


def make_merge_failed(change: Change, target: Target, tmp_path: Path) -> None:
    """Approved by another reviewer while the origin refused the push; origin put back."""
    with origin_moved(target, tmp_path):
        review_decide(change=change, decision="approve",
                      reviewer=cast(User, UserFactory(username="approver", roles=["reviewer"])))
    change.refresh_from_db()
    assert change.status == Change.Status.MERGE_FAILED


def perform(client: Client, action: str, change: Change) -> int:
    url = f"/reviews/changes/{change.pk}/"
    if action == "view":
        return client.get(url).status_code
    if action == "merge":
        return client.post(f"{url}merge/").status_code
    if action == "comment":
        return client.post(f"{url}comments/", {"path": "config/serving.toml", "line": 2,
                                               "side": "new", "text": "Why 8?"}).status_code
    return client.post(f"{url}decide/", {"decision": action,
                                         "diff_sha256": change.diff_sha256}).status_code


def effect(action: str, change: Change, before: dict[str, int]) -> bool:
    """Did the action change anything?"""
    change.refresh_from_db()
    if action == "merge":
        return change.status == Change.Status.MERGED
    if action == "comment":
        return ReviewComment.objects.count() > before["comments"]
    return ReviewDecision.objects.filter(change=change).count() > before["decisions"]


@pytest.mark.parametrize("action", ACTIONS)
@pytest.mark.parametrize("role", ROLES)
def test_the_authorization_matrix(role: str, action: str, client: Client,
                                  config_change: Change, example_target: Target,
                                  tmp_path: Path) -> None:
    if action == "merge":
        make_merge_failed(config_change, example_target, tmp_path)
    user = actor(role, config_change)
    if user is not None:
        client.force_login(user)
    before = {"decisions": ReviewDecision.objects.filter(change=config_change).count(),
              "comments": ReviewComment.objects.count(),
              "denied": AuditEntry.objects.filter(action__endswith="_denied").count()}

    status = perform(client, action, config_change)

    allowed = (role, action) in ALLOWED
    if action == "view":
        assert status == (200 if allowed else 302)
        return
    if allowed:
        assert status == 302, status
        assert effect(action, config_change, before)
    else:
        assert status == (302 if role == "agent" else 403), status
        assert not effect(action, config_change, before)
        denied = AuditEntry.objects.filter(action__endswith="_denied").count()
        assert denied == before["denied"] + (role != "agent")
