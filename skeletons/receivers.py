"""How the library hears of the apps below it: roles after migrate, changes from reviews."""

from __future__ import annotations

from typing import Any

from infraops.roles import ENGINEER, roles_grant
from skeletons.models import SkeletonUse
from skeletons.outcomes import skeleton_uses_from_knobs

GRANTS: dict[str, list[tuple[str, str, tuple[str, ...]]]] = {
    ENGINEER: [("skeletons", "skeleton", ("add", "change", "view"))]}


def grant_roles(**kwargs: Any) -> None:
    """Engineers edit the library in the admin (post_migrate: after migrate and after flush)."""
    roles_grant(GRANTS)


def uses_ride_on_change(*, change_id: int, **kwargs: Any) -> None:
    """The skeletons a run applied ride on its newest change: that change's decision is their
    outcome (skeletons/outcomes.py)."""
    SkeletonUse.objects.filter(run__changes=change_id, outcome=SkeletonUse.Outcome.APPLIED
                               ).update(change=change_id)


def uses_from_knobs(*, change_id: int, **kwargs: Any) -> None:
    """A change that sets a knob tied to a skeleton applies it (skeleton_uses_from_knobs)."""
    skeleton_uses_from_knobs(change_id=change_id)


def outcome_later(*, change_id: int, **kwargs: Any) -> None:
    """A merged or rejected change's meaning for the library is recorded by a worker: nothing
    in the library may hold up or undo the decision itself."""
    from skeletons.tasks import skeleton_outcome  # tasks import services, not the reverse

    skeleton_outcome.delay(change_id)
