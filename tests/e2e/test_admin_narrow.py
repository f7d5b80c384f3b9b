"""The goal editor in Debian's Chromium: at 390 px, as at desktop widths, the page itself never
scrolls sideways, and each criterion is a block of labelled fields rather than a table row
wider than the screen (admin/edit_inline/tabular_labelled.html, static/css/admin.css)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import django.contrib.admin
import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client
from playwright.sync_api import Browser, Page, ViewportSize

from infraops.models import Goal

PHONE: ViewportSize = {"width": 390, "height": 844}


@pytest.fixture
def phone(browser: Browser, live_server: Any, client: Client, engineer: User,
          close_thread_connections: None) -> Iterator[Page]:
    """A 390 px wide page signed in as the engineer (the test client's session cookie), in
    the session's browser (Debian's Chromium, tests/e2e/conftest.py). The live server's
    request threads open connections of their own: closed at the end, so that the test
    database can be dropped. Playwright runs the test in a context of its own, where the ORM
    would open yet another connection: a test asks for its rows before this page."""
    client.force_login(engineer)
    session = client.cookies[settings.SESSION_COOKIE_NAME].value
    context = browser.new_context(viewport=PHONE)
    context.add_cookies([{"name": settings.SESSION_COOKIE_NAME, "value": session,
                          "url": live_server.url}])
    yield context.new_page()
    context.close()


def overflow(page: Page) -> int:
    """How far the page itself is wider than the screen, in CSS pixels (0: it fits)."""
    return int(page.evaluate(
        "document.documentElement.scrollWidth - document.documentElement.clientWidth"))


@pytest.mark.e2e
@pytest.mark.browser
@pytest.mark.parametrize("path", ["{goal}/change/", "add/"])
def test_the_goal_editor_fits_a_390_px_screen(example_goal: Goal, phone: Page,
                                             live_server: Any, path: str) -> None:
    phone.goto(f"{live_server.url}/admin/infraops/goal/" + path.format(goal=example_goal.pk))
    phone.get_by_role("button", name="Add another Acceptance criterion").click()

    assert overflow(phone) == 0
    assert phone.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    criteria = phone.locator("#criteria-group")
    assert criteria.evaluate("box => box.scrollWidth <= box.clientWidth"), \
        "the criteria fit without scrolling sideways in their own box either"
    value = criteria.locator("tr.form-row:not(.empty-form) td.field-value").last
    assert value.evaluate("cell => getComputedStyle(cell, '::before').content") == '"Value"'
    box = value.locator("input").bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"]


@pytest.mark.e2e
@pytest.mark.browser
def test_the_criteria_fit_a_desktop_page_too(example_goal: Goal, phone: Page,
                                             live_server: Any) -> None:
    """As a table, the criteria made the whole page 1,903 px wide on a 1,280 px screen."""
    phone.goto(f"{live_server.url}/admin/infraops/goal/{example_goal.pk}/change/")
    for width in (768, 1024, 1280, 1600):
        phone.set_viewport_size({"width": width, "height": PHONE["height"]})
        assert overflow(phone) == 0, width
        assert phone.locator("#criteria-group").evaluate(
            "box => box.scrollWidth <= box.clientWidth"), width


def test_the_labelled_inline_template_is_djangos_tabular_one_with_labels() -> None:
    """Our copy must follow Django's template: on an upgrade that changes it, this fails and
    the copy is made again from the new one. Whitespace aside: our copy wraps Django's long
    lines inside its tags (templates/ keeps to 200 characters a line, tests/test_templates.py)."""
    django_admin = Path(django.contrib.admin.__file__).parent / "templates" / "admin"
    theirs = (django_admin / "edit_inline" / "tabular.html").read_text()
    ours = (Path(settings.BASE_DIR) / "templates" / "admin" / "edit_inline" /
            "tabular_labelled.html").read_text()

    def unspaced(text: str) -> str:
        return "".join(text.split())

    assert ours.startswith("{% comment %}")
    ours = unspaced(ours.split("{% endcomment %}\n", 1)[1])
    for labels in (' data-label="{{ field.field.label|capfirst }}"{% if field.field.help_text'
                   ' %} title="{{ field.field.help_text|striptags }}"{% endif %}',
                   ' data-label="{% translate "Delete?" %}"'):
        assert unspaced(labels) in ours
        ours = ours.replace(unspaced(labels), "", 1)
    assert ours == unspaced(theirs)
