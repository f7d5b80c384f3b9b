"""The cool-down of separation of duties as an admin sets it (GrantPolicy): a raise binds at
once, a lowering once the cool-down it replaced has run its course since."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest

from infraops.models import GrantPolicy

T0 = datetime(2026, 12, 1, 12, 0)


def hours(n: float) -> timedelta:
    return timedelta(hours=n)


def policy_after(changes: list[tuple[float, float | None]]) -> GrantPolicy:
    """A policy whose cool-down was set to each value at T0 plus the hours beside it."""
    policy = GrantPolicy()
    for at, value in changes:
        policy.cooldown_replace(value, T0 + hours(at))
    return policy


@pytest.mark.parametrize("changes, granted, decides", [
    ([], 0, 24),
    ([(0, 48)], 1, 49),
    ([(0, 0)], 1, 24),  # lowered at 0: the 24 it replaced holds until 24
    ([(0, 0)], 30, 30),  # granted after the hold ran out: at once
    ([(0, 12), (1, 0)], 2, 24),  # a second lowering: the first one's hold still ends at 24
    ([(0, 0), (1, 12)], 2, 24),  # a raise under the hold keeps the hold's end
    ([(0, 0), (1, None)], 2, 26),  # back to the default: 24 from the grant
], ids=["default", "raised", "lowered", "lowered-long-ago", "lowered-twice", "raised-under-hold",
        "default-again"])
def test_rights_decide_once_every_cool_down_that_binds_them_has_passed(
    changes: list[tuple[float, float | None]], granted: float, decides: float, settings: Any
) -> None:
    settings.REVIEW_GRANT_COOLDOWN_HOURS = 24

    policy = policy_after(changes)

    assert policy.decides_from(T0 + hours(granted)) == T0 + hours(decides)


def test_the_cool_down_in_force_is_the_held_one_until_its_end(settings: Any) -> None:
    settings.REVIEW_GRANT_COOLDOWN_HOURS = 24

    policy = policy_after([(0, 0)])

    assert [policy.cooldown_at(T0 + hours(h)) for h in (0, 23.9, 24)] == [24, 24, 0]
