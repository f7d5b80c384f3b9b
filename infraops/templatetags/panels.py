from __future__ import annotations

from typing import Any

from django import template
from django.template import Context
from django.utils.safestring import SafeString

from infraops.panels import panels_render

register = template.Library()


@register.simple_tag(takes_context=True)
def panels(context: Context, slot: str, obj: Any) -> SafeString:
    """What the apps above the core draw in `slot` for `obj` (infraops.panels)."""
    return panels_render(slot, context, obj)
