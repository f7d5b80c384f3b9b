"""What a newcomer saw in Debian's Chromium (issue 28): plotly charts that stayed white in the
dark scheme, chart legends that took half of a 390 px screen, a review queue wider than the
phone, a bare sign-in form, and a token budget the admin editor cut to 200000."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client
from playwright.sync_api import Browser, Page, ViewportSize

from infraops.models import Experiment, Goal
from tests.e2e.test_every_page import world

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

PHONE: ViewportSize = {"width": 390, "height": 844}
DESKTOP: ViewportSize = {"width": 1280, "height": 900}


@pytest.fixture
def open_page(browser: Browser, live_server: Any, client: Client, engineer: User,
              close_thread_connections: None) -> Iterator[Callable[..., Page]]:
    """A page signed in as the engineer (the test client's session cookie), of a given size
    and colour scheme."""
    client.force_login(engineer)
    session = client.cookies[settings.SESSION_COOKIE_NAME].value
    contexts = []

    def open_page(viewport: ViewportSize = PHONE, scheme: str = "light") -> Page:
        context = browser.new_context(viewport=viewport, color_scheme=scheme)  # type: ignore[arg-type]
        context.add_cookies([{"name": settings.SESSION_COOKIE_NAME, "value": session,
                              "url": live_server.url}])
        contexts.append(context)
        return context.new_page()

    yield open_page
    for context in contexts:
        context.close()


@pytest.fixture
def made(example_goal: Goal, engineer: User) -> dict[str, Any]:
    """A run, its experiment with charts, a change awaiting review (test_every_page.world),
    made on a thread of its own: Playwright's event loop runs on this one."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(world, example_goal, engineer).result(timeout=60)


@pytest.fixture
def charted(example_goal: Goal) -> Experiment:
    """An experiment whose page draws two charts with legends, named as a real probe names
    them (test_every_page's world names them with 200 characters, which plotly's margins
    make room for whatever the legend does)."""
    timeline = {"unit": "ms", "duration": 2.0, "threads": ["MainThread", "kv-transfer"],
                "spans": [[0, "dispatch", 0.0, 1.0], [1, "kv_transfer", 1.0, 1.5]],
                "waits": [[1, "gil_wait", 0.1, 1.0]], "idle": [[0, 1.0, 2.0]],
                "overlap": [], "left_out": 0}
    return Experiment.objects.create(
        target=example_goal.target, candidate_commit="b" * 40, baseline_commit="a" * 40,
        status=Experiment.Status.SUCCEEDED, probes=[example_goal.probe],
        feedback={"verdict": "faster", "counts": {"fail": 0, "warn": 0, "info": 0, "pass": 1},
                  "findings": [{"severity": "pass", "layer": "performance", "kind": "faster",
                                "title": "latency_ms improved", "detail": "", "evidence": {}}],
                  "distributions": [{"label": "latency_ms [batch_size=8]", "unit": "ms",
                                     "baseline": [10.0, 10.2, 10.1],
                                     "candidate": [9.0, 9.1, 9.2]}],
                  "timelines": {"prefill-kv [scenario=prefill_kv, candidate]": timeline}})


def charts_drawn(page: Page) -> None:
    page.locator("figure.chart-figure .js-plotly-plot").nth(1).wait_for(timeout=30_000)


def luminance(page: Page, css_colour: str) -> float:
    """0 (black) to 1 (white), of a computed colour such as 'rgb(227, 231, 236)'."""
    return float(page.evaluate("""(colour) => {
      const [r, g, b] = colour.match(/[\\d.]+/g).map(Number);
      return (0.2126 * r + 0.7152 * g + 0.0722 * b) / 255;
    }""", css_colour))


@pytest.mark.parametrize("scheme", ["dark", "light"])
def test_charts_are_drawn_in_the_pages_scheme(open_page: Callable[..., Page], live_server: Any,
                                              charted: Experiment, scheme: str) -> None:
    page = open_page(DESKTOP, scheme)
    page.goto(f"{live_server.url}/experiments/{charted.pk}/")
    charts_drawn(page)

    colours = page.evaluate("""() => Array.from(
        document.querySelectorAll('figure.chart-figure .js-plotly-plot'), (chart) => ({
          paper: getComputedStyle(chart.querySelector('svg.main-svg')).backgroundColor,
          plot: chart.querySelector('rect.bg')?.style.fillOpacity,
          tick: getComputedStyle(chart.querySelector('g.xtick text')).fill}))""")
    body = page.evaluate("getComputedStyle(document.body).backgroundColor")

    assert colours, "no chart"
    for chart in colours:
        assert chart["paper"] in ("rgba(0, 0, 0, 0)", "transparent"), chart
        assert chart["plot"] == "0", chart  # the plot area: no fill of its own
        ink = luminance(page, chart["tick"])
        assert (ink > 0.5) if scheme == "dark" else (ink < 0.5), chart
    assert (luminance(page, body) < 0.2) if scheme == "dark" else (luminance(page, body) > 0.8)


def test_a_phone_gives_the_plot_the_width_and_puts_the_legend_under_it(
        open_page: Callable[..., Page], live_server: Any, charted: Experiment) -> None:
    page = open_page(PHONE)
    page.goto(f"{live_server.url}/experiments/{charted.pk}/")
    charts_drawn(page)

    boxes = page.evaluate("""() => Array.from(
        document.querySelectorAll('figure.chart-figure .js-plotly-plot'), (chart) => {
          const legend = chart.querySelector('g.legend');
          // The plot area: every subplot's drag surface together.
          const areas = Array.from(chart.querySelectorAll('rect.nsewdrag'),
                                   (e) => e.getBoundingClientRect());
          const plot = areas.length ? {
            left: Math.min(...areas.map((a) => a.left)),
            right: Math.max(...areas.map((a) => a.right)),
            bottom: Math.max(...areas.map((a) => a.bottom))} : null;
          if (plot) plot.width = plot.right - plot.left;
          return {chart: chart.getBoundingClientRect().toJSON(),
                  legend: legend ? legend.getBoundingClientRect().toJSON() : null, plot};
        }).filter((found) => found.legend)""")

    assert boxes, "no chart with a legend"
    for found in boxes:
        beside = found["chart"]["x"] + found["chart"]["width"] - found["plot"]["right"]
        assert beside <= 0.1 * found["chart"]["width"], found  # no legend at the plot's side
        assert found["legend"]["top"] >= found["plot"]["bottom"] - 1, found


def test_the_review_queue_fits_a_phone(open_page: Callable[..., Page], live_server: Any,
                                       made: dict[str, Any]) -> None:
    page = open_page(PHONE)
    page.goto(f"{live_server.url}/reviews/")

    widths = page.evaluate("""() => ({
        page: document.documentElement.scrollWidth,
        table: document.querySelector('table.queue').getBoundingClientRect().right,
        filters: document.querySelector('form.filters').scrollWidth})""")

    assert widths["page"] <= PHONE["width"], widths
    assert widths["table"] <= PHONE["width"], widths
    assert widths["filters"] <= PHONE["width"], widths


@pytest.mark.parametrize("viewport", [PHONE, DESKTOP], ids=["phone", "desktop"])
def test_the_token_budget_is_shown_whole_in_the_goal_editor(
        open_page: Callable[..., Page], live_server: Any, example_goal: Goal,
        viewport: ViewportSize) -> None:
    """max_tokens 2000000 read as 200000: the admin's integer field is 10 characters wide."""
    example_goal.boundary.max_tokens = 2_000_000
    example_goal.boundary.save()
    page = open_page(viewport)
    page.goto(f"{live_server.url}/admin/infraops/goal/{example_goal.pk}/change/")

    cut = page.evaluate("""() => Array.from(
        document.querySelectorAll('#boundary-group input[type=number]'),
        (input) => ({name: input.name, value: input.value,
                     cut: input.scrollWidth > input.clientWidth}))
        .filter((input) => input.cut)""")

    assert page.locator("input[name='boundary-0-max_tokens']").input_value() == "2000000"
    assert cut == []


@pytest.mark.parametrize("viewport", [PHONE, DESKTOP], ids=["phone", "desktop"])
def test_the_sign_in_page_is_a_form_with_wide_fields_and_says_where_the_password_is(
        browser: Browser, live_server: Any, viewport: ViewportSize) -> None:
    context = browser.new_context(viewport=viewport)
    page = context.new_page()
    page.goto(f"{live_server.url}/accounts/login/")

    form = page.locator("main form").bounding_box()
    fields = [page.get_by_label(name).bounding_box() for name in ("Username", "Password")]
    button = page.get_by_role("button", name="Sign in").bounding_box()
    hint = page.locator("#first-password-hint").inner_text()
    context.close()

    assert form is not None and button is not None
    assert form["x"] >= 0 and form["x"] + form["width"] <= viewport["width"]
    for field in fields:
        assert field is not None and field["width"] >= 0.85 * form["width"], field
    assert button["width"] >= 0.85 * form["width"]
    assert "printed the passwords of admin and reviewer once" in hint
    assert "changepassword admin" in hint
