"""`{{ value|local_time }}`: a moment as a <time> element, in UTC with the zone named, which
static/js/local-time.js rewrites in the viewer's own zone (the zone named again). Without
JavaScript the page still says which zone its times are in."""

from __future__ import annotations

from datetime import UTC, datetime

from django import template
from django.utils.html import format_html
from django.utils.safestring import SafeString

register = template.Library()

FORMATS = {"time": "%H:%M:%S", "datetime": "%Y-%m-%d %H:%M"}


@register.filter
def local_time(value: datetime | None, style: str = "time") -> SafeString | str:
    if not isinstance(value, datetime):
        return ""
    if style not in FORMATS:
        raise template.TemplateSyntaxError(f"local_time: {style!r} is not one of {list(FORMATS)}")
    moment = value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)
    return format_html('<time datetime="{}" data-local="{}">{} UTC</time>',
                       moment.isoformat().replace("+00:00", "Z"), style,
                       moment.strftime(FORMATS[style]))
