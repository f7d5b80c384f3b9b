"""manage.py adduser and load_example: a new installation's first users see its first target.

With per-target access (infraops.access) a user who is no member of a target sees nothing of
it, so the commands that make the first users and the example target make them members."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command

from infraops.access import target_role, visible_targets
from infraops.models import Target

pytestmark = pytest.mark.django_db


def test_load_example_makes_the_existing_role_holders_members_in_their_first_role() -> None:
    call_command("adduser", "admin", "--role", "engineer", "--admin", "--password", "p")
    call_command("adduser", "rae", "--role", "reviewer", "--password", "p")
    call_command("adduser", "both", "--role", "viewer", "--role", "engineer", "--password", "p")
    User.objects.create_user("nobody-with-no-role")

    call_command("load_example")

    example = Target.objects.get(name="tiny-serving")
    assert target_role(User.objects.get(username="rae"), example) == "reviewer"
    assert target_role(User.objects.get(username="both"), example) == "engineer"
    assert not visible_targets(User.objects.get(username="nobody-with-no-role")).exists()
    assert sorted(example.memberships.values_list("user__username", flat=True)) == [
        "both", "rae"]  # the superuser sees every target without one
    call_command("load_example")  # idempotent
    assert example.memberships.count() == 2


def test_adduser_target_makes_the_user_a_member_and_an_unknown_target_changes_nothing(
    example_target: Target,
) -> None:
    call_command("adduser", "vic", "--role", "viewer", "--target", example_target.name,
                 "--password", "p")
    assert target_role(User.objects.get(username="vic"), example_target) == "viewer"

    with pytest.raises(CommandError, match="No target named 'nope': nothing was changed"):
        call_command("adduser", "newcomer", "--role", "viewer", "--target", "nope")
    assert not User.objects.filter(username="newcomer").exists()
