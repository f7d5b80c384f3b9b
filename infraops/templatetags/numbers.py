"""`{{ value|significant }}`: a number with four significant digits (3.9e-06, 0.8734, 1841),
where floatformat's fixed decimals would print a small error or ratio as 0.0000."""

from __future__ import annotations

from django import template

from infraops.feedback.numbers import significant as _significant

register = template.Library()


@register.filter
def significant(value: object, digits: int = 4) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return ""
    return _significant(value, digits)
