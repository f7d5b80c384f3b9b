"""The skeleton library's workflows in the core: who may promote a skeleton, and promoting it
(draft -> reviewed -> trusted), audited. A skeleton's outcome from a merged or rejected change
is skeletons/outcomes.py; an agent's use of one is skeletons/tools.py."""

from __future__ import annotations

from django.contrib.auth.models import User
from django.utils import timezone

from infraops.access import is_superuser
from infraops.errors import DomainError, Forbidden
from infraops.models import TargetMembership
from infraops.roles import ENGINEER, REVIEWER
from infraops.services.audit import audit_record
from skeletons.models import Skeleton


def promotion_denial(user: User) -> str | None:
    """Why `user` may not promote skeletons, in a sentence; None when they may. The library
    belongs to no target: an engineer or reviewer on any target (or a superuser) promotes."""
    if not user.is_authenticated:
        return "Sign in as an engineer or a reviewer to promote a skeleton."
    if is_superuser(user):
        return None
    if TargetMembership.objects.filter(user_id=user.pk, role__in=(ENGINEER, REVIEWER)).exists():
        return None
    return "Only an engineer or a reviewer promotes a skeleton."


def trust_denial(skeleton: Skeleton) -> str | None:
    """Why the skeleton cannot become trusted yet; None when it can. Trust is earned by an
    outcome: at least one accepted use with a verified gain."""
    if skeleton.usage().gains:
        return None
    return ("A skeleton becomes trusted once a run applied it and its change merged with a "
            "verified gain; this one has none yet.")


def skeleton_promote(*, skeleton: Skeleton, user: User, expected: str
                     ) -> Skeleton:
    """Promote the skeleton one step, from `expected` (the status the person saw) to the
    next: draft -> reviewed -> trusted.

    Precondition: the person may promote (promotion_denial); the skeleton is still
    `expected` (a guarded update: a second, concurrent promotion from the same page gets a
    clear error and no second effect); a promotion to trusted needs trust_denial None."""
    denial = promotion_denial(user)
    if denial is not None:
        raise Forbidden(denial)
    assert isinstance(user, User)
    target = Skeleton.status_after(expected)
    if target is None:
        raise DomainError(f"A {expected or 'blank'} skeleton cannot be promoted: the steps are "
                          "draft, reviewed, trusted.")
    if target == Skeleton.Status.TRUSTED and (reason := trust_denial(skeleton)) is not None:
        raise DomainError(reason)
    done = Skeleton.objects.filter(pk=skeleton.pk, status=expected).update(
        status=target, promoted_by=user, promoted_at=timezone.now(), updated_at=timezone.now())
    if not done:
        skeleton.refresh_from_db()
        raise DomainError(f"This skeleton is {skeleton.status} now, not {expected}: someone "
                          "changed it meanwhile, so nothing was done. Reload the page.")
    audit_record(actor=user, action="skeleton.promote", obj=skeleton,
                 data={"from": expected, "to": target})
    skeleton.refresh_from_db()
    return skeleton
