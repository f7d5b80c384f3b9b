"""Grants of rights: who gave a user a role on a target, or made them a superuser, and when.

Separation of duties rests on these records (issue 27): "someone else reviews" must hold per
person, not per account, so a reviewer whose rights on a target were granted by a run's
starter, directly or through an admin that starter made, never decides that starter's
changes; and rights younger than the cool-down decide nothing yet (an admin sets it,
GrantPolicy; the environment's INFRAOPS_REVIEW_GRANT_COOLDOWN_HOURS until then). Superusers
are no exception: their reviewer rights come from a grant too.

Contracts:
- Every grant sets who granted it and when, and writes one audit entry: `membership_grant`
  (`membership.grant`), `superuser_grant` (`user.superuser_grant`), `membership_stamp` for the
  admin's inline, whose formset audit writes the entry (`membership.add`, `.change`).
- `by=None` is the operator at the command line (a management command, `by_label` naming
  it): the operator can change the database itself, so separation of duties is the web's
  rule, and such grants are not held to the cool-down.
- The cool-down's changes are audited as grants are (`grant_policy_set`,
  `grant_policy.cooldown`).
- A user created already a superuser (`createsuperuser`, a shell: no page of ours creates
  one, the admin's add form has no such field) gets its grant from `superuser_created`, on
  the user's first save, by the operator. Every other path makes the user first and a
  superuser by a later save, and records that grant itself: each is recorded once.
- A grant with no record (a row from before grants were recorded, or a superuser made by an
  edit outside these functions) is shown as "not recorded" and treated as the operator's.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from infraops.errors import DomainError
from infraops.models import (
    MAX_COOLDOWN_HOURS,
    GrantPolicy,
    SuperuserGrant,
    Target,
    TargetMembership,
)
from infraops.reads import JoinedRead
from infraops.roles import REVIEWER
from infraops.services.audit import audit_record

OPERATOR = "the operator (command line)"
CREATED_SUPERUSER = "the operator (created as a superuser: createsuperuser or a shell)"
NOT_RECORDED = "not recorded (before grants were recorded)"
# A grantor's own rights are followed this far up (an admin made by an admin made by ...).
MAX_CHAIN = 10


@dataclass(frozen=True)
class Grant:
    """One way a user holds rights: what (`via`), by whom, when (None: not recorded)."""

    via: str
    granted_by_id: int | None
    granted_by: str
    granted_at: datetime | None

    def as_record(self) -> dict[str, Any]:
        """JSON for a decision's record and its audit row."""
        return {"via": self.via, "granted_by": self.granted_by,
                "granted_by_id": self.granted_by_id,
                "granted_at": self.granted_at.isoformat() if self.granted_at else None}


def _label(by: User | None, by_label: str) -> str:
    return by.get_username() if by is not None else (by_label or OPERATOR)


def membership_stamp(membership: TargetMembership, *, by: User | None,
                     by_label: str = "") -> TargetMembership:
    """Mark an unsaved membership (new, or its role changed) as granted now by `by`. The
    caller saves it and writes the audit entry (the admin's inline formset does both)."""
    membership.granted_by = by
    membership.granted_by_label = _label(by, by_label)
    membership.granted_at = timezone.now()
    return membership


def membership_grant(*, target: Target, user: User, role: str, by: User | None,
                     by_label: str = "") -> TargetMembership:
    """`user` holds `role` on `target` from now, granted by `by`: a new membership, or a
    changed role. A member already in that role keeps their grant (nothing is written)."""
    membership = TargetMembership.objects.filter(target=target, user=user).first()
    previous = membership.role if membership is not None else None
    if previous == role:
        assert membership is not None
        return membership
    if membership is None:
        membership = TargetMembership(target=target, user=user)
    membership.role = role
    membership_stamp(membership, by=by, by_label=by_label).save()
    audit_record(actor=by, actor_label="" if by else membership.granted_by_label,
                 action="membership.grant", obj=target,
                 data={"user": user.get_username(), "user_id": user.pk, "role": role,
                       "previous_role": previous})
    return membership


def superuser_grant(*, user: User, by: User | None, by_label: str = "") -> SuperuserGrant:
    """Record that `user` was made a superuser now by `by` (the caller sets the flag)."""
    grant = SuperuserGrant.objects.create(user=user, granted_by=by,
                                          granted_by_label=_label(by, by_label),
                                          granted_at=timezone.now())
    audit_record(actor=by, actor_label="" if by else grant.granted_by_label,
                 action="user.superuser_grant", obj=user,
                 data={"user": user.get_username()})
    return grant


def superuser_created(sender: Any, *, instance: User, created: bool, raw: bool = False,
                      **kwargs: Any) -> None:
    """post_save of a user: one created already a superuser gets its grant, by the operator
    (see the contracts above). Fixtures loaded raw are records as they were."""
    if created and not raw and instance.is_superuser:
        superuser_grant(user=instance, by=None, by_label=CREATED_SUPERUSER)


def roles_changed_audit(*, user: User, before: set[str], after: set[str], by: User | None,
                        superuser_before: bool, by_label: str = "") -> None:
    """Audit a user's global roles and superuser status after an edit: one entry for each
    role granted or taken away, and a SuperuserGrant when the user became a superuser."""
    for role in sorted(after - before):
        audit_record(actor=by, actor_label="" if by else _label(by, by_label),
                     action="user.role_grant", obj=user,
                     data={"user": user.get_username(), "role": role})
    for role in sorted(before - after):
        audit_record(actor=by, actor_label="" if by else _label(by, by_label),
                     action="user.role_revoke", obj=user,
                     data={"user": user.get_username(), "role": role})
    if user.is_superuser and not superuser_before:
        superuser_grant(user=user, by=by, by_label=by_label)
    elif superuser_before and not user.is_superuser:
        audit_record(actor=by, actor_label="" if by else _label(by, by_label),
                     action="user.superuser_revoke", obj=user,
                     data={"user": user.get_username()})


def _superuser_grant_of(user_id: int) -> Grant:
    latest = SuperuserGrant.objects.filter(user_id=user_id).first()
    if latest is None:
        return Grant("superuser", None, NOT_RECORDED, None)
    return Grant("superuser", latest.granted_by_id, latest.granted_by_label, latest.granted_at)


# A user's membership in one role on one target (one at most), read by a statement built once
# per process: the change page asks it on every read.
_REVIEWER_MEMBERSHIP = JoinedRead(
    TargetMembership, where='t0."user_id" = %s AND t0."target_id" = %s AND t0."role" = %s',
    order_by='t0."id"', limit=1)


def reviewer_grants(user: User, target_id: int) -> list[Grant]:
    """The grants through which `user` holds the reviewer role on the target now: their
    superuser status, their reviewer membership, or both."""
    grants = []
    if user.is_superuser:
        grants.append(_superuser_grant_of(user.pk))
    membership = _REVIEWER_MEMBERSHIP.get(user.pk, target_id, REVIEWER)
    if membership is not None:
        if membership.granted_at is None:
            grants.append(Grant("reviewer membership", None, NOT_RECORDED, None))
        else:
            grants.append(Grant("reviewer membership", membership.granted_by_id,
                                membership.granted_by_label or OPERATOR, membership.granted_at))
    return grants


def granted_through(grant: Grant, person_id: int) -> list[str]:
    """The chain of grantors from `grant` up to `person_id`, by name, when that person is
    in it ([] when not): the grantor, or an admin that person made, or one made by one
    they made... Admins grant memberships and superuser status, so an admin's own rights
    are their superuser grant."""
    chain: list[str] = []
    grantor_id, label = grant.granted_by_id, grant.granted_by
    seen: set[int] = set()
    while grantor_id is not None and grantor_id not in seen and len(seen) < MAX_CHAIN:
        chain.append(label)
        if grantor_id == person_id:
            return chain
        seen.add(grantor_id)
        above = _superuser_grant_of(grantor_id)
        grantor_id, label = above.granted_by_id, above.granted_by
    return []


def grant_policy_set(*, cooldown_hours: float | None, by: User) -> GrantPolicy:
    """Set the cool-down of separation of duties (None: the environment's default again),
    audited as grants are. A lowered one binds once the one in force has run its course
    from now (GrantPolicy.cooldown_replace); a raised one at once."""
    if cooldown_hours is not None and not 0 <= cooldown_hours <= MAX_COOLDOWN_HOURS:
        raise DomainError(f"A cool-down is between 0 and {MAX_COOLDOWN_HOURS:,} hours (a "
                          f"year); {cooldown_hours:g} is not. Nothing was changed.")
    with transaction.atomic():
        GrantPolicy.objects.get_or_create(pk=GrantPolicy.SINGLETON)
        policy = GrantPolicy.objects.select_for_update().get(pk=GrantPolicy.SINGLETON)
        before = policy.cooldown_hours
        if before == cooldown_hours:
            return policy
        now = timezone.now()
        policy.cooldown_replace(cooldown_hours, now)
        policy.changed_by, policy.changed_at = by, now
        policy.save()
        audit_record(actor=by, action="grant_policy.cooldown", obj=policy,
                     data={"before": before, "after": cooldown_hours,
                           "in_force": policy.cooldown_at(now),
                           "held_until": policy.held_until.isoformat()
                           if policy.held_until else None})
    return policy


def separation_problem(user: User, target_id: int, starter: User | None) -> str | None:
    """Why `user`'s reviewer rights on the target may not decide a change whose run
    `starter` started, in a sentence; None when they may."""
    now = timezone.now()
    policy: GrantPolicy | None = None  # read only for rights a person granted
    for grant in reviewer_grants(user, target_id):
        chain = granted_through(grant, starter.pk) if starter is not None else []
        if chain:
            how = chain[0] + "".join(f", made an admin by {name}" for name in chain[1:])
            return (f"Your {grant.via} was granted by {how}: {starter} started the run that "
                    "wrote this change, and rights they granted never decide their changes. "
                    "A reviewer whose rights someone else granted decides.")
        if grant.granted_by_id is None or grant.granted_at is None:
            continue
        policy = policy or GrantPolicy.load()
        ready = policy.decides_from(grant.granted_at)
        if now < ready:
            return (f"Your {grant.via} was granted by {grant.granted_by} at "
                    f"{timezone.localtime(grant.granted_at):%Y-%m-%d %H:%M %Z}: rights younger "
                    f"than {policy.cooldown_at(now):g} hours decide no change yet (from "
                    f"{timezone.localtime(ready):%Y-%m-%d %H:%M %Z}).")
    return None
