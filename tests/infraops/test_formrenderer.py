"""The form renderer draws a select exactly as Django's templates do, faster."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from django import forms
from django.forms.renderers import DjangoTemplates
from django.utils.safestring import mark_safe

from infraops.project.formrenderer import FormRenderer

CASES: dict[str, tuple[forms.Field, Any]] = {
    "plain": (forms.ChoiceField(choices=[("a", "A"), ("b", "B & <b>")]), "b"),
    "empty first": (forms.ChoiceField(choices=[("", "any"), ("x", "X")], required=False), ""),
    "numbers": (forms.IntegerField(widget=forms.Select(choices=[("", "any"), (1, 1),
                                                                 (1234567, 1234567.5)])), 1),
    "groups": (forms.ChoiceField(choices=[("Fruit", [("ap", "Apple"), ("pe", "Pear")]),
                                          ("Veg", [("ca", 'Carrot "x"')]), ("z", "Z")]), "pe"),
    "multiple": (forms.MultipleChoiceField(choices=[("a", "A"), ("b", "B"), ("c", "C")]),
                 ["a", "c"]),
    "attrs": (forms.ChoiceField(choices=[("a", "A")], widget=forms.Select(attrs={
        "class": "x y", "disabled": True, "data-q": '"quoted" & <tag>', "hidden": False,
        "hx-get": "/reviews/?a=1&b=2"})), "a"),
    "safe and lazy": (forms.ChoiceField(choices=[(mark_safe("<i>"), mark_safe("<b>bold</b>")),
                                                 ("d", datetime.date(2026, 12, 6))]), "<i>"),
    "tuple value": (forms.ChoiceField(choices=[(("t", 1), "tuple")]), ""),
    "no choices": (forms.ChoiceField(choices=[]), ""),
}


@pytest.mark.parametrize("case", CASES)
def test_a_select_is_drawn_character_for_character_as_django_draws_it(case: str) -> None:
    field, value = CASES[case]

    class Form(forms.Form):
        pick = field

    ours = str(Form(initial={"pick": value}, renderer=FormRenderer())["pick"])
    django_s = str(Form(initial={"pick": value}, renderer=DjangoTemplates())["pick"])
    assert ours == django_s
    assert "<select" in ours


def test_a_select_whose_option_template_was_changed_is_left_to_django() -> None:
    class Starred(forms.Select):
        option_template_name = "django/forms/widgets/input_option.html"

    html = Starred(choices=[("a", "A")]).render("pick", "a", renderer=FormRenderer())
    assert html == Starred(choices=[("a", "A")]).render("pick", "a", renderer=DjangoTemplates())
    assert "<option" not in html  # the changed template, not ours


def test_the_project_renders_forms_with_it(settings: Any) -> None:
    from django.forms.renderers import get_default_renderer

    assert isinstance(get_default_renderer(), FormRenderer)
