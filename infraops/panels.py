"""Places on the core's pages where the apps above the core add their part.

The target page shows each goal's run controls and the target's runs; the experiment page
names the runs that asked for it and the changes it is the evidence of. Those belong to
``agents`` and ``reviews``, which the core may not import: each registers a panel for a slot
from its app config, and the core's templates draw the slot with ``{% panels "slot" obj %}``
(``infraops.templatetags.panels``). A slot no app filled draws nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.template import Context
from django.template.loader import render_to_string
from django.utils.html import format_html_join
from django.utils.safestring import SafeString

# The slots the core's templates draw, and what each panel is given besides the page context.
SLOTS = {
    "target": "the target (below its goals)",
    "target-goal": "one goal of the target (below its boundary)",
    "experiment": "the experiment (below its heading)",
}

# A panel's context: (the page's context, the slot's object) -> the template's context, or
# None to draw nothing.
PanelContext = Callable[[Context, Any], "dict[str, Any] | None"]
_PANELS: dict[str, list[tuple[str, PanelContext]]] = {slot: [] for slot in SLOTS}


def panel_register(slot: str, *, template: str, context: PanelContext) -> None:
    """Draw `template` in `slot` with the context `context` returns. Idempotent per template,
    since an app config's ready() may run twice in tests."""
    if slot not in SLOTS:
        raise ValueError(f"no slot {slot!r} on the core's pages; slots: {', '.join(SLOTS)}")
    _PANELS[slot] = [(t, c) for t, c in _PANELS[slot] if t != template] + [(template, context)]


def panels_render(slot: str, page: Context, obj: Any) -> SafeString:
    request = page.get("request")
    drawn = []
    for template, context in _PANELS[slot]:
        found = context(page, obj)
        if found is not None:
            drawn.append((render_to_string(template, found, request=request),))
    return format_html_join("", "{}", drawn)
