"""Times on the pages name their zone: UTC from the server, the viewer's own after
static/js/local-time.js rewrote them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from django.conf import settings
from django.template import Context, Template, TemplateSyntaxError


def render(text: str, **context: object) -> str:
    return Template("{% load local_time %}" + text).render(Context(context))


def test_a_moment_is_a_time_element_in_utc_with_the_zone_named() -> None:
    moment = datetime(2026, 12, 2, 6, 15, 24, tzinfo=UTC)
    assert render("{{ t|local_time }}", t=moment) == (
        '<time datetime="2026-12-02T06:15:24Z" data-local="time">06:15:24 UTC</time>')
    assert render('{{ t|local_time:"datetime" }}', t=moment) == (
        '<time datetime="2026-12-02T06:15:24Z" data-local="datetime">2026-12-02 06:15 UTC</time>')


def test_another_zone_is_shown_as_the_same_moment_in_utc() -> None:
    paris = datetime(2026, 12, 2, 7, 15, 24, tzinfo=timezone(timedelta(hours=1)))
    assert "06:15:24 UTC" in render("{{ t|local_time }}", t=paris)


def test_nothing_for_no_moment_and_an_error_for_an_unknown_style() -> None:
    assert render("{{ t|local_time }}", t=None) == ""
    assert render("{{ t|local_time }}", t="yesterday") == ""
    with pytest.raises(TemplateSyntaxError, match="not one of"):
        render('{{ t|local_time:"weekday" }}', t=datetime.now(UTC))


def test_every_page_loads_the_script_that_names_the_viewers_zone() -> None:
    base = (Path(settings.BASE_DIR) / "templates" / "base.html").read_text()
    script = Path(settings.BASE_DIR) / "static" / "js" / "local-time.js"
    assert "js/local-time.js" in base and "timeZoneName" in script.read_text()
    for page in (Path(settings.BASE_DIR) / "templates").rglob("*.html"):
        text = page.read_text()
        assert '|time:"H' not in text and '|date:"H' not in text and \
            '|date:"Y-m-d H:i"' not in text, f"{page.name} shows a time without its zone"
