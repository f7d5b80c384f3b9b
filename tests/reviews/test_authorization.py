"""Who may do what on a change, its run and its goal, through real HTTP requests: 0 unexpected
allows or denies.

Roles by actions. The agent has no account: it reaches the site, if at all, as an anonymous
client. Every refused attempt at a change by a signed-in person answers 403 and leaves an
audit row; by an engineer of another target only, 404 (the id is not confirmed) and the row
all the same. Cancelling the run and editing the goal need the engineer role on the target."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest
from django.contrib.auth.models import User
from django.test import Client

from agents.models import AgentRun
from infraops.models import AuditEntry, Goal, Target
from reviews.models import Change, ReviewComment, ReviewDecision, ReviewerProfile
from reviews.services import review_decide
from tests.conftest import member
from tests.factories import AgentRunFactory, TargetFactory, UserFactory
from tests.infraops.test_admin import form_of
from tests.reviews.conftest import origin_moved

ROLES = ["viewer", "engineer", "run-starter", "reviewer-of-another-class", "reviewer", "admin",
         "agent", "member-elsewhere"]
CHANGE_ACTIONS = ["view", "approve", "reject", "request_changes", "merge", "comment"]
ENGINEERING = ["cancel_run", "edit_goal"]
ACTIONS = CHANGE_ACTIONS + ENGINEERING
MAY_DECIDE = {"reviewer", "admin"}
ALLOWED = {(role, "view") for role in ROLES if role not in ("agent", "member-elsewhere")} | {
    (role, action) for role in MAY_DECIDE for action in CHANGE_ACTIONS}
# A reviewer of another class may still comment on a line: a comment decides nothing.
ALLOWED |= {("reviewer-of-another-class", "comment"), ("run-starter", "comment")}
# The run's starter reviews on this target (a reviewer membership): no longer its engineer.
ALLOWED |= {(role, action) for role in ("engineer", "admin") for action in ENGINEERING}


def actor(role: str, change: Change) -> User | None:
    if role == "agent":
        return None
    if role == "run-starter":
        starter = cast(User, change.requested_by)
        return member(starter, change.target, "reviewer")
    if role == "admin":
        return User.objects.create_superuser("ada", "ada@example.test", "pw")
    if role == "member-elsewhere":
        elsewhere = TargetFactory.create(name="elsewhere")
        return member(cast(User, UserFactory(username="elsa", roles=["engineer"],
                                             member_of=[])), elsewhere, "engineer")
    roles = {"viewer": ["viewer"], "engineer": ["engineer"], "reviewer": ["reviewer"],
             "reviewer-of-another-class": ["reviewer"]}[role]
    user = cast(User, UserFactory(username=f"u-{role}", roles=roles))
    if role == "reviewer-of-another-class":
        ReviewerProfile.objects.create(user=user, risk_classes=["numerics", "concurrency"])
    return user


def goal_form_of(goal: Goal) -> dict[str, str]:
    """The goal's admin form as an admin's browser would send it back unchanged."""
    admin_client = Client()
    admin_client.force_login(User.objects.create_superuser("root", "root@example.test", "pw"))
    return form_of(admin_client, f"/admin/infraops/goal/{goal.pk}/change/")


def make_merge_failed(change: Change, target: Target, tmp_path: Path) -> None:
    """Approved by another reviewer while the origin refused the push; origin put back."""
    with origin_moved(target, tmp_path):
        review_decide(change=change, decision="approve",
                      reviewer=cast(User, UserFactory(username="approver", roles=["reviewer"])))
    change.refresh_from_db()
    assert change.status == Change.Status.MERGE_FAILED


def perform(client: Client, action: str, change: Change, goal: Goal, run: AgentRun,
            goal_form: dict[str, str]) -> int:
    if action == "cancel_run":
        return client.post(f"/runs/{run.pk}/cancel/").status_code
    if action == "edit_goal":
        return client.post(f"/admin/infraops/goal/{goal.pk}/change/",
                           goal_form | {"name": "renamed"}).status_code
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


def effect(action: str, change: Change, goal: Goal, run: AgentRun,
           before: dict[str, int]) -> bool:
    """Did the action change anything?"""
    if action == "cancel_run":
        run.refresh_from_db()
        return run.status == AgentRun.Status.CANCELLED
    if action == "edit_goal":
        goal.refresh_from_db()
        return goal.name == "renamed"
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
                                  example_goal: Goal, tmp_path: Path) -> None:
    if action == "merge":
        make_merge_failed(config_change, example_target, tmp_path)
    run = AgentRunFactory.create(goal=example_goal,
                                 started_by=cast(User, config_change.requested_by),
                                 base_commit=config_change.base_commit)
    goal_form = goal_form_of(example_goal) if action == "edit_goal" else {}
    user = actor(role, config_change)
    if user is not None:
        client.force_login(user)
    before = {"decisions": ReviewDecision.objects.filter(change=config_change).count(),
              "comments": ReviewComment.objects.count(),
              "denied": AuditEntry.objects.filter(action__endswith="_denied").count()}

    status = perform(client, action, config_change, example_goal, run, goal_form)

    allowed = (role, action) in ALLOWED
    unseen = role == "member-elsewhere"
    if action == "view":
        assert status == (200 if allowed else 404 if unseen else 302)
        return
    assert effect(action, config_change, example_goal, run, before) == allowed
    if allowed:
        assert status == 302, status
    elif action in ENGINEERING:
        # A refusal page (403), the sign-in page (302: no staff access) or the run page
        # with the reason (302); never the other target's objects.
        assert status == 404 if unseen else status in (302, 403), status
    else:
        assert status == (302 if role == "agent" else 404 if unseen else 403), status
        denied = AuditEntry.objects.filter(action__endswith="_denied").count()
        assert denied == before["denied"] + (role != "agent")
