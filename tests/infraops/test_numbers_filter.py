"""{{ value|significant }} (infraops/templatetags/numbers.py) on the pages' tables."""

from __future__ import annotations


def test_the_medians_table_shows_a_small_error_with_its_digits() -> None:
    from django.template import Context, Template

    page = Template("{% load numbers %}{{ a|significant }} {{ b|significant }} "
                    "{{ c|significant }}|{{ d|significant }}").render(
        Context({"a": 3.9e-06, "b": 0.83, "c": 4.7e-06, "d": "text"}))
    assert page == "3.9e-06 0.83 4.7e-06|"
