"""infraops/feedback/numbers.py: significant digits, never fixed decimals."""

from __future__ import annotations

import math

import pytest

from infraops.feedback.numbers import significant


@pytest.mark.parametrize(("value", "text"), [
    (3.9e-06, "3.9e-06"), (5.408e-06, "5.408e-06"), (0.87341, "0.8734"), (0.0, "0"),
    (1841.2, "1841"), (63905.4, "63905"), (2.5e16, "2.5e+16"), (7, "7"), (None, ""),
    (math.inf, "inf"), (-0.000123456, "-0.0001235"),
])
def test_a_number_keeps_four_significant_digits(value: float | None, text: str) -> None:
    assert significant(value) == text


def test_a_ratio_of_a_precision_fix_is_not_printed_as_zero() -> None:
    from infraops.feedback import findings as feedback
    from infraops.feedback.stats import compare

    result = compare([0.86, 0.87, 0.86, 0.88, 0.87], [4.3e-6, 4.2e-6, 4.3e-6, 4.4e-6, 4.3e-6])
    [found] = feedback.performance_findings("cp", "", "rel_error", "", "", result, {},
                                            kind="error")
    assert "ratio 4.943e-06 (95% CI " in found.detail and "ratio 0.000" not in found.detail

