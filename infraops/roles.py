"""The three roles, as Django groups created by a migration."""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser

ENGINEER = "engineer"
REVIEWER = "reviewer"
VIEWER = "viewer"
ROLES = (ENGINEER, REVIEWER, VIEWER)


def user_roles(user: AbstractBaseUser | AnonymousUser) -> set[str]:
    if not user.is_authenticated:
        return set()
    names = set(user.groups.values_list("name", flat=True))  # type: ignore[attr-defined]
    if getattr(user, "is_superuser", False):
        names |= {ENGINEER, REVIEWER}
    return names & set(ROLES)


def has_role(user: AbstractBaseUser | AnonymousUser, role: str) -> bool:
    return role in user_roles(user)
