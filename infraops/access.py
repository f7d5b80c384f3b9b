"""Who may see and do what, per target: the one place views, services, sockets and the admin
ask.

A superuser sees every target and holds the engineer and reviewer roles on each. Anyone else
sees only the targets they are a member of (`TargetMembership`), and holds there exactly the
membership's role; their global groups (infraops.roles) give them the admin editor's model
permissions and nothing on a target. An object of a target the user does not see answers 404,
as an id that does not exist does, so ids are not confirmed.
"""

from __future__ import annotations

from typing import Any, TypeGuard, TypeVar

from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.db import connections, router
from django.db.models import Model, QuerySet
from django.http import Http404, HttpRequest
from django_htmx.middleware import HtmxDetails

from infraops.models import Target, TargetMembership
from infraops.reads import JoinedRead
from infraops.roles import ENGINEER, REVIEWER, AnyUser, roles_of, user_roles

M = TypeVar("M", bound=Model)
Q = TypeVar("Q", bound=QuerySet[Any])

NOT_FOUND = "No such page, or not one of your targets'."


class AuthenticatedHttpRequest(HttpRequest):
    """The request type of our views: signed in (LoginRequiredMiddleware lets no anonymous
    request reach a view), with .htmx from HtmxMiddleware."""

    user: User
    htmx: HtmxDetails


def is_superuser(user: AnyUser) -> bool:
    return user.is_authenticated and bool(getattr(user, "is_superuser", False))


def scoped(queryset: Q, user: AnyUser, path: str = "target") -> Q:
    """The rows of `queryset` whose target (reached by `path`; "" for targets themselves)
    the user sees."""
    if is_superuser(user):
        return queryset
    if not user.is_authenticated:
        return queryset.none()
    mine = TargetMembership.objects.filter(user_id=user.pk).values("target_id")
    return queryset.filter(**{f"{path}__in" if path else "pk__in": mine})


# The targets a member sees, as a literal statement (bandit, B608).
_MEMBER_TARGETS = "SELECT target_id FROM infraops_targetmembership WHERE user_id = %s"


def visible_target_ids(user: AnyUser) -> list[int] | None:
    """The ids of the targets the user sees; None for every target (a superuser). For reads
    that filter by a list (infraops.reads) rather than by `scoped`'s subquery."""
    if is_superuser(user):
        return None
    if not user.is_authenticated:
        return []
    with connections[router.db_for_read(TargetMembership)].cursor() as cursor:
        cursor.execute(_MEMBER_TARGETS, [user.pk])
        return [row[0] for row in cursor.fetchall()]


def visible_targets(user: AnyUser) -> QuerySet[Target]:
    return scoped(Target.objects.all(), user, path="")


def targets_with_role(user: AnyUser, role: str) -> QuerySet[Target]:
    """The targets on which the user holds `role` (every target for a superuser)."""
    if is_superuser(user):
        return Target.objects.all()
    if not user.is_authenticated:
        return Target.objects.none()
    return Target.objects.filter(memberships__user_id=user.pk, memberships__role=role)


# TargetMembership's role, as a literal statement (bandit, B608): each run page and socket
# asks, and the ORM's query cost ten times the round trip in CPU (bench/load.py).
_ROLE = "SELECT role FROM infraops_targetmembership WHERE user_id = %s AND target_id = %s"


def target_roles(user: AnyUser, target_id: int | None) -> set[str]:
    """The roles the user holds on that target (empty when they do not see it)."""
    if is_superuser(user):
        return {ENGINEER, REVIEWER}
    if not user.is_authenticated or target_id is None:
        return set()
    with connections[router.db_for_read(TargetMembership)].cursor() as cursor:
        cursor.execute(_ROLE, [user.pk, target_id])
        row = cursor.fetchone()
    return {row[0]} if row else set()


def target_role(user: AnyUser, target: Target) -> str | None:
    """The one role of a member on the target (superusers: engineer), else None."""
    roles = target_roles(user, target.pk)
    return ENGINEER if ENGINEER in roles else next(iter(roles), None)


def has_target_role(user: AnyUser, target_id: int | None,
                    role: str) -> TypeGuard[User]:
    """True when the user is signed in and holds the role on that target (narrows to User)."""
    return role in target_roles(user, target_id)


def has_any_access(user: AnyUser) -> bool:
    """Signed in with a role: a global group, a membership, or superuser."""
    if not user.is_authenticated:
        return False
    return bool(user_roles(user)) or TargetMembership.objects.filter(user_id=user.pk).exists()


_ROLES_OF_REQUEST = "_infraops_roles"
# The user's group names, as the authentication backend (reviews.backends) reads them with
# the request's user, in the same query.
GROUP_NAMES_ATTRIBUTE = "infraops_group_names"


def request_roles(request: HttpRequest) -> set[str]:
    """The signed-in user's roles, read once per request: the view's access check and the
    page's navigation and controls (infraops.project.context_processors) share one query, or none
    where the backend read the group names with the user. Per request, not per user instance:
    a websocket's user lives for hours, and its roles must be re-read."""
    roles: set[str] | None = getattr(request, _ROLES_OF_REQUEST, None)
    if roles is None:
        user = request.user
        names = getattr(user, GROUP_NAMES_ATTRIBUTE, None) if user.is_authenticated else None
        roles = user_roles(user) if names is None else roles_of(names, user)
        setattr(request, _ROLES_OF_REQUEST, roles)
    return roles


def require_any_role(request: HttpRequest) -> None:
    if not request_roles(request) and not has_any_access(request.user):
        raise PermissionDenied("Your account has no role yet: ask an admin for one.")


def get_visible_or_404(queryset: QuerySet[M], request: HttpRequest, path: str = "target",
                       **lookup: Any) -> M:
    """The object, if it exists and the user sees its target; else 404 (either way the
    same answer). Needs a role first (403 without one: that says nothing about ids)."""
    require_any_role(request)
    found = scoped(queryset, request.user, path).filter(**lookup).first()
    if found is None:
        raise Http404(NOT_FOUND)
    return found


def read_visible_or_404(read: JoinedRead[M], request: HttpRequest, pk: Any) -> M:
    """`get_visible_or_404` for an object with a `target_id`, read by `read` (one statement
    built once: infraops.reads) and checked by the user's roles on its target, which the
    request keeps for the page's controls (`request_target_roles`)."""
    require_any_role(request)
    found = read.get(pk)
    if found is None or not request_target_roles(request, found.target_id):  # type: ignore[attr-defined]
        raise Http404(NOT_FOUND)
    return found


def request_target_roles(request: HttpRequest, target_id: int | None) -> set[str]:
    """`target_roles` of the request's user, asked once per request and target."""
    memo: dict[int | None, set[str]] = request.__dict__.setdefault("_infraops_target_roles", {})
    if target_id not in memo:
        memo[target_id] = target_roles(request.user, target_id)
    return memo[target_id]
