"""The three roles, as Django groups created by a migration."""

from __future__ import annotations

from typing import TypeGuard

from django.contrib.auth.models import AnonymousUser, User

ENGINEER = "engineer"
REVIEWER = "reviewer"
VIEWER = "viewer"
ROLES = (ENGINEER, REVIEWER, VIEWER)


def user_roles(user: User | AnonymousUser) -> set[str]:
    if not user.is_authenticated:
        return set()
    names = set(user.groups.values_list("name", flat=True))
    if getattr(user, "is_superuser", False):
        names |= {ENGINEER, REVIEWER}
    return names & set(ROLES)


def has_role(user: User | AnonymousUser, role: str) -> TypeGuard[User]:
    """True when the user is signed in and holds the role (narrows the type to User)."""
    return role in user_roles(user)
