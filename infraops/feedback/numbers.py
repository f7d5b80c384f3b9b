"""Numbers as people read them: significant digits, never a fixed count of decimals (an error
of 3.9e-06 printed with four decimals is "0.0000", and a ratio of 5e-06 is "0.000"). Pure."""

from __future__ import annotations

import math

DIGITS = 4


def significant(value: float | int | None, digits: int = DIGITS) -> str:
    """`value` with `digits` significant digits: 0.8734, 3.9e-06, 1841, 63905 (a number of
    `digits` or more whole digits keeps them all rather than turn into 6.39e+04); "" for
    None, and NaN and infinities as Python spells them."""
    if value is None:
        return ""
    number = float(value)
    if not math.isfinite(number) or number == 0:
        return f"{number:g}"
    if 10**digits <= abs(number) < 1e15:
        return f"{number:.0f}"
    return f"{number:.{digits}g}"
