"""The change page in Debian's Chromium (issue 27): the evidence flows in the page, so every
chart, the concurrency timeline above all, is reached by scrolling the page itself, never a
box inside it; 'Request changes' says on the page where the comment went; a reviewer whose
rights the run's starter granted reads why they cannot decide."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from playwright.sync_api import Browser, Page, expect

from agents.models import AgentRun, RunMessage
from infraops.grants import membership_grant
from infraops.models import Goal
from reviews.models import Change
from tests.e2e.conftest import signed_in
from tests.e2e.test_every_page import world
from tests.factories import UserFactory

pytestmark = [pytest.mark.e2e, pytest.mark.browser]


@pytest.fixture
def made(example_goal: Goal, engineer: User, reviewer: User) -> dict[str, Any]:
    # On a thread of its own: Playwright's event loop runs on this one, and the events'
    # notifications (async_to_sync) refuse to run beside it.
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(world, example_goal, engineer).result(timeout=60)


# For each chart: the boxes between it and the page that scroll on their own and hold more
# than they show; then, with the page itself scrolled to the chart, what the browser finds at
# the chart's middle (the chart, when nothing covers or clips it).
CHART_REACH = """() => Array.from(
    document.querySelectorAll(".review-evidence .chart")).map((chart) => {
  const boxes = [];
  for (let up = chart.parentElement; up && up !== document.body; up = up.parentElement) {
    const style = getComputedStyle(up);
    if (/(auto|scroll|hidden)/.test(style.overflowY) && up.scrollHeight > up.clientHeight + 1) {
      boxes.push(`${up.tagName.toLowerCase()}.${up.className}`);
    }
  }
  const top = chart.getBoundingClientRect().top + window.scrollY;
  window.scrollTo(0, top - 40);
  const rect = chart.getBoundingClientRect();
  const found = document.elementFromPoint(rect.left + rect.width / 2,
                                          Math.min(rect.top + 40, window.innerHeight - 1));
  return {id: chart.id, boxes, reached: !!found && chart.contains(found)};
})"""


def test_every_chart_of_the_evidence_is_reached_by_scrolling_the_page(
        desktop: Page, live_server: Any, made: dict[str, Any]) -> None:
    desktop.goto(f"{live_server.url}/reviews/changes/{made['change'].pk}/")
    expect(desktop.locator(".review-evidence .chart").first).to_be_attached()

    charts = desktop.evaluate(CHART_REACH)

    assert len(charts) >= 2  # the distributions, the concurrency timeline
    assert [c for c in charts if c["boxes"] or not c["reached"]] == []
    height = desktop.evaluate("document.documentElement.scrollHeight")
    assert height > 720  # the evidence is longer than the screen: the page scrolls


def test_request_changes_says_on_the_page_that_the_comment_went_to_the_running_run(
        desktop: Page, live_server: Any, made: dict[str, Any], reviewer: User) -> None:
    run: AgentRun = made["run"]
    desktop.goto(f"{live_server.url}/reviews/changes/{made['change'].pk}/")
    expect(desktop.locator("#my-rights")).to_contain_text("Your reviewer rights here")

    desktop.get_by_label("Comment (goes back to the agent").fill("Try batch_size=4 first.")
    desktop.get_by_role("button", name="Request changes").click()

    delivery = desktop.locator(".delivery")
    expect(delivery).to_contain_text(
        f"The comment went to run {run.pk} (running) as a message: the agent reads it at its "
        "next step.")
    expect(delivery.get_by_role("link", name=f"run {run.pk}")).to_have_attribute(
        "href", f"/runs/{run.pk}/")
    with ThreadPoolExecutor(max_workers=1) as pool:
        texts = pool.submit(lambda: list(RunMessage.objects.filter(run=run).values_list(
            "text", flat=True))).result(timeout=30)
    assert len(texts) == 1 and texts[0].endswith("Try batch_size=4 first.")


def test_a_reviewer_the_starter_granted_sees_why_they_cannot_decide(
        browser: Browser, live_server: Any, client: Client, made: dict[str, Any],
        engineer: User, close_thread_connections: None) -> None:
    change: Change = made["change"]

    def starter_grants_a_second_account() -> User:
        Change.objects.filter(pk=change.pk).update(requested_by=engineer)
        second: User = UserFactory.create(username="second", roles=["reviewer"], member_of=[])
        membership_grant(target=change.target, user=second, role="reviewer", by=engineer)
        return second

    with ThreadPoolExecutor(max_workers=1) as pool:
        second = pool.submit(starter_grants_a_second_account).result(timeout=30)
    context = signed_in(browser, live_server, client, second)
    page = context.new_page()
    page.goto(f"{live_server.url}/reviews/changes/{change.pk}/")

    expect(page.locator("#decide-denial")).to_contain_text(
        f"Your reviewer membership was granted by {engineer.username}: {engineer.username} "
        "started the run that wrote this change")
    expect(page.get_by_role("button", name="Request changes")).to_have_count(0)
    context.close()
