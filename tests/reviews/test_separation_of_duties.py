"""Separation of duties per person, not per account (issue 27): a reviewer whose rights on
the target a run's starter granted (in the admin, directly or through an admin the starter
made), or anyone granted less than the cool-down ago, cannot decide that starter's changes;
superusers included. Every grant is an audit row; the change page says who granted the
decider's rights and when."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from infraops.grants import (
    CREATED_SUPERUSER,
    membership_grant,
    reviewer_grants,
    superuser_grant,
)
from infraops.models import AuditEntry, GrantPolicy, SuperuserGrant, Target, TargetMembership
from reviews.models import Change, ReviewDecision
from tests.factories import UserFactory
from tests.infraops.test_commands import prepare


def superuser(name: str) -> User:
    user: User = UserFactory.create(username=name, roles=["engineer"], member_of=[])
    user.is_superuser = user.is_staff = True
    user.save()
    return user


def membership_form(target: Target, add: list[tuple[User, str]]) -> dict[str, Any]:
    """The target's admin form as its page would post it, with these members added."""
    rows = list(TargetMembership.objects.filter(target=target).order_by("pk"))
    data: dict[str, Any] = {
        "name": target.name, "repo_url": target.repo_url, "base_branch": target.base_branch,
        "memberships-TOTAL_FORMS": len(rows) + len(add),
        "memberships-INITIAL_FORMS": len(rows),
        "memberships-MIN_NUM_FORMS": 0, "memberships-MAX_NUM_FORMS": 1000,
    }
    if target.push_on_merge:
        data["push_on_merge"] = "on"
    for n, row in enumerate(rows):
        data |= {f"memberships-{n}-id": row.pk, f"memberships-{n}-target": target.pk,
                 f"memberships-{n}-user": row.user_id, f"memberships-{n}-role": row.role}
    for n, (user, role) in enumerate(add, start=len(rows)):
        data |= {f"memberships-{n}-target": target.pk, f"memberships-{n}-user": user.pk,
                 f"memberships-{n}-role": role}
    return data


def admin_add_member(client: Client, target: Target, user: User, role: str) -> None:
    response = client.post(f"/admin/infraops/target/{target.pk}/change/",
                           membership_form(target, [(user, role)]))
    assert response.status_code == 302, response.content.decode()[:3000]


def user_form(user: User, **changes: Any) -> dict[str, Any]:
    """Django's user change form as its page would post it, with `changes`."""
    data: dict[str, Any] = {
        "username": user.username, "first_name": "", "last_name": "", "email": "",
        "is_active": "on", "date_joined_0": "2026-12-01", "date_joined_1": "10:00:00",
        "groups": list(user.groups.values_list("pk", flat=True)),
    }
    if user.is_staff:
        data["is_staff"] = "on"
    if user.is_superuser:
        data["is_superuser"] = "on"
    for name, value in changes.items():
        if value is False:
            data.pop(name, None)
        else:
            data[name] = "on" if value is True else value
    return data


def words(html: str) -> str:
    """The page with its runs of white space as one space, as a browser shows it."""
    return " ".join(html.split())


def decide(client: Client, change: Change, decision: str = "approve") -> Any:
    return client.post(f"/reviews/changes/{change.pk}/decide/",
                       {"decision": decision, "diff_sha256": change.diff_sha256})


@pytest.fixture
def starter(config_change: Change) -> User:
    """The engineer who started the change's run, a superuser (no exception to the rule)."""
    user = config_change.requested_by
    assert user is not None
    User.objects.filter(pk=user.pk).update(is_superuser=True, is_staff=True)
    user.refresh_from_db()
    return user


def test_an_account_the_starter_made_a_reviewer_in_the_admin_cannot_approve_their_change(
    client: Client, config_change: Change, starter: User
) -> None:
    # The case: a superuser makes a second account, gives it the reviewer role and
    # the target's membership, and that account approves the first one's change.
    second: User = UserFactory.create(username="sock", roles=["reviewer"], member_of=[])
    client.force_login(starter)
    admin_add_member(client, config_change.target, second, "reviewer")
    client.force_login(second)

    response = decide(client, config_change)

    assert response.status_code == 403
    page = response.content.decode()
    assert f"Your reviewer membership was granted by {starter.username}" in page
    assert "rights they granted never decide their changes" in page
    assert not ReviewDecision.objects.filter(change=config_change).exists()
    denied = AuditEntry.objects.get(action="change.approve_denied", actor=second)
    assert f"granted by {starter.username}" in denied.data["reason"]
    config_change.refresh_from_db()
    assert config_change.status == Change.Status.PENDING_REVIEW


def test_a_superuser_the_starter_made_cannot_decide_and_neither_can_whom_they_granted(
    client: Client, config_change: Change, starter: User
) -> None:
    made_admin: User = UserFactory.create(username="deputy", member_of=[])
    made_admin.is_staff = True
    made_admin.save()
    client.force_login(starter)
    response = client.post(f"/admin/auth/user/{made_admin.pk}/change/",
                           user_form(made_admin, is_superuser=True))
    assert response.status_code == 302, response.content.decode()[:3000]
    made_admin.refresh_from_db()
    assert made_admin.is_superuser
    # The one the starter made an admin grants a third account its rights.
    third: User = UserFactory.create(username="third", roles=["reviewer"], member_of=[])
    client.force_login(made_admin)
    admin_add_member(client, config_change.target, third, "reviewer")

    client.force_login(made_admin)
    by_deputy = decide(client, config_change, "reject")
    client.force_login(third)
    by_third = decide(client, config_change, "reject")

    assert by_deputy.status_code == 403
    assert f"Your superuser was granted by {starter.username}" in by_deputy.content.decode()
    assert by_third.status_code == 403
    assert (f"granted by deputy, made an admin by {starter.username}"
            in by_third.content.decode())
    assert not ReviewDecision.objects.filter(change=config_change).exists()


def test_rights_younger_than_the_cool_down_decide_nothing_yet_whoever_granted_them(
    client: Client, config_change: Change, starter: User, settings: Any
) -> None:
    settings.REVIEW_GRANT_COOLDOWN_HOURS = 24
    other_admin = superuser("olga")
    fresh: User = UserFactory.create(username="fresh", roles=["reviewer"], member_of=[])
    membership_grant(target=config_change.target, user=fresh, role="reviewer", by=other_admin)
    client.force_login(fresh)

    refused = decide(client, config_change)
    TargetMembership.objects.filter(user=fresh).update(
        granted_at=timezone.now() - timedelta(hours=25))
    allowed = decide(client, config_change, "reject")

    assert refused.status_code == 403
    assert "Your reviewer membership was granted by olga at" in refused.content.decode()
    assert "rights younger than 24 hours decide no change yet" in refused.content.decode()
    assert allowed.status_code == 302
    assert ReviewDecision.objects.get(change=config_change).reviewer == fresh


def test_the_change_page_says_who_granted_the_deciders_rights_and_when(
    client: Client, config_change: Change, starter: User
) -> None:
    other_admin = superuser("olga")
    rae: User = UserFactory.create(username="rae2", roles=["reviewer"], member_of=[])
    membership = membership_grant(target=config_change.target, user=rae, role="reviewer",
                                  by=other_admin)
    two_days_ago = timezone.now() - timedelta(days=2)
    TargetMembership.objects.filter(pk=membership.pk).update(granted_at=two_days_ago)
    client.force_login(rae)

    before = words(client.get(f"/reviews/changes/{config_change.pk}/").content.decode())
    decide(client, config_change, "reject")
    after = words(client.get(f"/reviews/changes/{config_change.pk}/").content.decode())

    assert "Your reviewer rights here: reviewer membership granted by <strong>olga</strong> at" \
        in before
    rights = after[after.index('class="muted decision-rights"'):]
    rights = rights[:rights.index("</div>")]
    assert "rae2's reviewer rights here" in rights and "<strong>olga</strong> at" in rights
    assert two_days_ago.isoformat()[:16] in rights  # the local_time element's datetime
    decision = ReviewDecision.objects.get(change=config_change)
    assert decision.rights == [{"via": "reviewer membership", "granted_by": "olga",
                                "granted_by_id": other_admin.pk,
                                "granted_at": two_days_ago.isoformat()}]
    entry = AuditEntry.objects.get(action="change.reject")
    assert entry.data["rights"] == decision.rights


def test_every_grant_of_a_role_or_membership_is_an_audit_row(
    client: Client, example_target: Target
) -> None:
    admin = superuser("root")
    newcomer: User = UserFactory.create(username="newcomer", member_of=[])
    newcomer.is_staff = True
    newcomer.save()
    reviewer_group = Group.objects.get_or_create(name="reviewer")[0]
    client.force_login(admin)

    client.post(f"/admin/auth/user/{newcomer.pk}/change/",
                user_form(newcomer, groups=[reviewer_group.pk], is_superuser=True))
    admin_add_member(client, example_target, newcomer, "reviewer")
    call_command("adduser", "cli-user", "--role", "viewer", "--target", example_target.name,
                 "--password", "p")

    actions = list(AuditEntry.objects.order_by("pk").values_list("actor_label", "action",
                                                                 "data"))
    granted = [(who, action) for who, action, _ in actions
               if action.startswith(("user.", "membership."))]
    assert granted == [
        ("root", "user.role_grant"), ("root", "user.superuser_grant"),
        ("root", "membership.add"),
        ("manage.py adduser", "user.role_grant"), ("manage.py adduser", "membership.grant"),
    ]
    grant = SuperuserGrant.objects.get(user=newcomer)
    assert grant.granted_by == admin
    member = TargetMembership.objects.get(user=newcomer, target=example_target)
    assert member.granted_by == admin and member.granted_at is not None
    cli = TargetMembership.objects.get(user__username="cli-user")
    assert cli.granted_by is None and cli.granted_by_label == "manage.py adduser"


def make_superuser(path: str, client: Client, settings: Any, tmp_path: Path) -> User:
    """A superuser named 'made', made the way `path` makes one."""
    if path == "createsuperuser":
        call_command("createsuperuser", "--noinput", username="made",
                     email="made@example.test", stdout=StringIO())
    elif path == "the admin":
        client.force_login(superuser("root"))
        added = client.post("/admin/auth/user/add/", {
            "username": "made", "usable_password": "true",
            "password1": "a long passphrase 1", "password2": "a long passphrase 1"})
        assert added.status_code == 302, added.content.decode()[:3000]
        made = User.objects.get(username="made")
        changed = client.post(f"/admin/auth/user/{made.pk}/change/",
                              user_form(made, is_staff=True, is_superuser=True))
        assert changed.status_code == 302, changed.content.decode()[:3000]
    else:  # the standalone's first start: its admin
        prepare(settings, tmp_path, "--no-example")
        User.objects.filter(username="admin").update(username="made")
    return User.objects.get(username="made", is_superuser=True)


@pytest.mark.parametrize("path, granted_by", [
    ("createsuperuser", CREATED_SUPERUSER),
    ("the admin", "root"),
    ("the first start", "manage.py adduser"),
], ids=["createsuperuser", "admin", "first-start"])
def test_a_superuser_is_granted_on_record_exactly_once_whatever_made_them(
    path: str, granted_by: str, client: Client, settings: Any, tmp_path: Path, db: None
) -> None:
    # createsuperuser wrote no grant: its superuser's rights read "not recorded".
    made = make_superuser(path, client, settings, tmp_path)

    grants = list(SuperuserGrant.objects.filter(user=made).values_list("granted_by_label",
                                                                       flat=True))
    audited = AuditEntry.objects.filter(action="user.superuser_grant",
                                        object_id=str(made.pk))
    assert grants == [granted_by]
    assert list(audited.values_list("actor_label", flat=True)) == [granted_by]
    rights = reviewer_grants(made, 0)
    assert [(r.via, r.granted_by) for r in rights] == [("superuser", granted_by)]
    assert rights[0].granted_at is not None


def test_grants_the_operator_made_at_the_command_line_are_not_held_to_the_cool_down(
    client: Client, config_change: Change, settings: Any
) -> None:
    # The first start's users (prepare -> adduser) review at once: the demo's flow.
    settings.REVIEW_GRANT_COOLDOWN_HOURS = 24
    call_command("adduser", "ops-reviewer", "--role", "reviewer", "--target",
                 config_change.target.name, "--password", "p")
    client.force_login(User.objects.get(username="ops-reviewer"))

    response = decide(client, config_change, "reject")

    assert response.status_code == 302
    page = words(client.get(f"/reviews/changes/{config_change.pk}/").content.decode())
    assert "reviewer membership granted by <strong>manage.py adduser</strong>" in page


def test_a_superuser_grant_the_starter_made_outside_the_admin_is_caught_too(
    config_change: Change, starter: User
) -> None:
    from reviews.services import decision_denial

    deputy = superuser("deputy2")
    superuser_grant(user=deputy, by=starter)

    assert decision_denial(deputy, config_change) == (
        f"Your superuser was granted by {starter.username}: {starter.username} started the "
        "run that wrote this change, and rights they granted never decide their changes. A "
        "reviewer whose rights someone else granted decides.")


def test_only_admins_read_who_made_whom_a_superuser(client: Client, reviewer: User,
                                                   engineer: User) -> None:
    admin = superuser("root")
    superuser_grant(user=superuser("deputy3"), by=admin)
    seen = {}
    for user in (reviewer, engineer, admin):
        client.force_login(user)
        seen[user.username] = client.get("/admin/infraops/superusergrant/").status_code

    # A reviewer is not staff: the admin sends them to its sign-in; an engineer is refused.
    assert seen == {reviewer.username: 302, engineer.username: 403, "root": 200}


# --- the cool-down, set by an admin ----------------------------------------------------

def set_cooldown(client: Client, hours: str) -> Any:
    return client.post(f"/admin/infraops/grantpolicy/{GrantPolicy.SINGLETON}/change/",
                       {"cooldown_hours": hours})


def test_an_admin_sets_the_cool_down_in_the_admin_editor_and_a_raise_binds_at_once(
    client: Client, config_change: Change, starter: User, settings: Any
) -> None:
    settings.REVIEW_GRANT_COOLDOWN_HOURS = 24  # the environment's default
    admin = superuser("olga")
    rae: User = UserFactory.create(username="rae3", roles=["reviewer"], member_of=[])
    membership_grant(target=config_change.target, user=rae, role="reviewer", by=admin)
    TargetMembership.objects.filter(user=rae).update(
        granted_at=timezone.now() - timedelta(hours=30))
    client.force_login(admin)
    assert client.get("/admin/infraops/grantpolicy/").url == \
        f"/admin/infraops/grantpolicy/{GrantPolicy.SINGLETON}/change/"
    shown = words(client.get(f"/admin/infraops/grantpolicy/{GrantPolicy.SINGLETON}/change/")
                  .content.decode())
    assert "24 hours (the default, INFRAOPS_REVIEW_GRANT_COOLDOWN_HOURS)" in shown

    saved = set_cooldown(client, "48")
    client.force_login(rae)
    refused = decide(client, config_change)

    assert saved.status_code == 302
    assert GrantPolicy.load().cooldown_hours == 48
    entry = AuditEntry.objects.get(action="grant_policy.cooldown")
    assert (entry.actor, entry.data["before"], entry.data["after"], entry.data["in_force"]) == (
        admin, None, 48, 48)
    assert refused.status_code == 403
    assert "rights younger than 48 hours decide no change yet" in refused.content.decode()


def test_a_lowered_cool_down_binds_only_once_the_one_it_replaced_has_run_its_course(
    client: Client, config_change: Change, starter: User, settings: Any
) -> None:
    # Lowering it to 0 and at once making an account a reviewer would bypass it otherwise.
    settings.REVIEW_GRANT_COOLDOWN_HOURS = 24
    admin = superuser("olga")
    client.force_login(admin)
    assert set_cooldown(client, "0").status_code == 302
    fresh: User = UserFactory.create(username="fresh2", roles=["reviewer"], member_of=[])
    admin_add_member(client, config_change.target, fresh, "reviewer")
    shown = words(client.get(f"/admin/infraops/grantpolicy/{GrantPolicy.SINGLETON}/change/")
                  .content.decode())
    client.force_login(fresh)

    while_held = decide(client, config_change)
    GrantPolicy.objects.update(held_until=timezone.now() - timedelta(seconds=1))
    after_it_ran_out = decide(client, config_change, "reject")

    assert "24 hours (the default, INFRAOPS_REVIEW_GRANT_COOLDOWN_HOURS)" not in shown
    assert "24 hours: it was lowered to 0 hours, which binds from" in shown
    assert while_held.status_code == 403
    assert "rights younger than 24 hours decide no change yet" in while_held.content.decode()
    assert after_it_ran_out.status_code == 302
    assert ReviewDecision.objects.get(change=config_change).reviewer == fresh


@pytest.mark.parametrize("hours, error", [
    ("-1", "greater than or equal to 0"),
    ("9000", "less than or equal to 8760"),
    ("soon", "Enter a number"),
    ("inf", "Enter a number"),
], ids=["negative", "over-a-year", "not-a-number", "infinite"])
def test_a_cool_down_out_of_range_is_refused_with_a_clear_error(
    client: Client, hours: str, error: str, db: None
) -> None:
    client.force_login(superuser("olga"))

    response = set_cooldown(client, hours)

    assert response.status_code == 200
    assert error in response.content.decode()
    assert not GrantPolicy.objects.exists()
    assert not AuditEntry.objects.filter(action="grant_policy.cooldown").exists()


def test_only_admins_read_or_set_the_cool_down(client: Client, engineer: User) -> None:
    User.objects.filter(pk=engineer.pk).update(is_staff=True)
    client.force_login(engineer)

    listed = client.get("/admin/infraops/grantpolicy/")
    posted = set_cooldown(client, "0")
    index = client.get("/admin/").content.decode()

    assert (listed.status_code, posted.status_code) == (403, 403)
    assert "grantpolicy" not in index
    assert not GrantPolicy.objects.exists()
