"""The three roles, as Django groups: made by a migration, and again after every `flush`
(which empties auth_group too) by a post_migrate handler, with their model permissions."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TypeAlias

from django.contrib.auth.models import AnonymousUser, User

ENGINEER = "engineer"
REVIEWER = "reviewer"
VIEWER = "viewer"
ROLES = (ENGINEER, REVIEWER, VIEWER)

# A user as Django hands it to code that may run before sign-in is checked (the access
# checks, sockets, context processors). Views and services, behind sign-in, take User.
AnyUser: TypeAlias = User | AnonymousUser

# role -> (app label, model, actions) for the admin editor. Migration 0002 keeps its own copy,
# as migrations must; a grant added here reaches existing databases at the next migrate.
ROLE_PERMISSIONS: dict[str, list[tuple[str, str, tuple[str, ...]]]] = {
    ENGINEER: [
        ("infraops", "target", ("add", "change", "view")),
        ("infraops", "goal", ("add", "change", "view")),
        ("infraops", "boundary", ("add", "change", "view")),
        ("infraops", "acceptancecriterion", ("add", "change", "delete", "view")),
        ("infraops", "goalversion", ("view",)),
        ("infraops", "experiment", ("view",)),
    ],
    REVIEWER: [("infraops", "auditentry", ("view",))],
    VIEWER: [],
}


def ensure_roles(**kwargs: object) -> None:
    """The role groups and their grants exist (post_migrate: after migrate and after flush).
    Adds what is missing; never removes a permission an operator granted."""
    roles_grant(ROLE_PERMISSIONS)


def roles_grant(grants_by_role: Mapping[str, list[tuple[str, str, tuple[str, ...]]]]) -> None:
    """Give each role group (made if missing) these model permissions; apps above the core
    call it from their own post_migrate handler with their models' grants."""
    from django.contrib.auth.models import Group, Permission

    for role, grants in grants_by_role.items():
        group, _ = Group.objects.get_or_create(name=role)
        for app_label, model, actions in grants:
            wanted = Permission.objects.filter(
                content_type__app_label=app_label, content_type__model=model,
                codename__in=[f"{action}_{model}" for action in actions])
            group.permissions.add(*wanted)


def user_roles(user: AnyUser) -> set[str]:
    if not user.is_authenticated:
        return set()
    return roles_of(user.groups.values_list("name", flat=True), user)


def roles_of(group_names: Iterable[str], user: AnyUser) -> set[str]:
    """The roles that these group names of the user give (a superuser holds them all)."""
    names = set(group_names)
    if getattr(user, "is_superuser", False):
        names |= {ENGINEER, REVIEWER}
    return names & set(ROLES)
