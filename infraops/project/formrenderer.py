"""The forms' renderer: Django's own, with the select widget drawn in Python.

Django draws a `<select>` through its template and an `{% include %}` of the option template,
and of the attributes template, for every option: on the review queue, whose filters list
every target and goal, that was half of the page's web CPU (about 5 ms a request under load,
`bench/load.py`). `FormRenderer` writes exactly what those templates write, character for
character (tests/infraops/test_formrenderer.py renders each case both ways), and leaves every
other template, and any select whose option template a widget changed, to Django.
"""

from __future__ import annotations

from typing import Any

from django.forms.renderers import DjangoTemplates
from django.http import HttpRequest
from django.template import Context
from django.template.base import render_value_in_context
from django.utils.safestring import SafeData, mark_safe

SELECT = "django/forms/widgets/select.html"
OPTION = "django/forms/widgets/select_option.html"


class FormRenderer(DjangoTemplates):
    def render(self, template_name: str, context: dict[str, Any],
               request: HttpRequest | None = None) -> str:
        widget = context.get("widget")
        if template_name == SELECT and isinstance(widget, dict) and _plain_options(widget):
            return select_html(widget)
        return str(super().render(template_name, context, request))


def _plain_options(widget: dict[str, Any]) -> bool:
    return all(option.get("template_name") == OPTION
               for _group, options, _index in widget.get("optgroups", ()) for option in options)


_CONTEXT = Context()  # autoescape on, the settings' localization and time zone


def _text(value: Any) -> str:
    """`{{ value }}`: localized, then escaped unless marked safe."""
    return str(render_value_in_context(value, _CONTEXT))


def _formatted(value: Any) -> str:
    """`{{ value|stringformat:'s' }}`: the filter keeps a safe value safe (is_safe)."""
    text = f"{str(value) if isinstance(value, tuple) else value}"
    # The value was safe already: the filter's is_safe keeps it so.
    return _text(mark_safe(text) if isinstance(value, SafeData) else text)  # noqa: S308  # nosec


def _attrs(attrs: dict[str, Any]) -> str:
    """django/forms/widgets/attrs.html."""
    return "".join(f" {_text(name)}" if value is True else f' {_text(name)}="{_formatted(value)}"'
                   for name, value in attrs.items() if value is not False)


def select_html(widget: dict[str, Any]) -> str:
    """django/forms/widgets/select.html with select_option.html for each option, as the
    renderer returns it (stripped)."""
    parts = [f'<select name="{_text(widget["name"])}"{_attrs(widget["attrs"])}>']
    for group_name, options, _index in widget["optgroups"]:
        if group_name:
            parts.append(f'\n  <optgroup label="{_text(group_name)}">')
        for option in options:
            parts.append(f'\n  <option value="{_formatted(option["value"])}"'
                         f'{_attrs(option["attrs"])}>{_text(option["label"])}</option>\n')
            # (the option template's own last line break)
        if group_name:
            parts.append("\n  </optgroup>")
    parts.append("\n</select>")
    return "".join(parts).strip()
