"""`{{ value|local_time }}`: a moment as a <time> element, in UTC with the zone named, which
static/js/local-time.js rewrites in the viewer's own zone (the zone named again). Without
JavaScript the page still says which zone its times are in. `{{ start|duration:end }}`: how
long from one to the other (to now without an end), as people say it: 2 h 5 min, 3 min 12 s."""

from __future__ import annotations

from datetime import UTC, datetime

from django import template
from django.utils import timezone
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


@register.filter
def duration(start: datetime | None, end: datetime | None = None) -> str:
    if not isinstance(start, datetime):
        return ""
    seconds = max(int(((end or timezone.now()) - start).total_seconds()), 0)
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes} min"
    return f"{minutes} min {seconds} s" if minutes else f"{seconds} s"


@register.filter
def minutes_between(start: datetime | None, end: datetime | None = None) -> float:
    """Minutes from one moment to the other (to now without an end), for a progress bar."""
    if not isinstance(start, datetime):
        return 0.0
    return round(max(((end or timezone.now()) - start).total_seconds(), 0) / 60, 1)
