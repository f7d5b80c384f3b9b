"""Reviews that tell the truth, in Debian's Chromium (issue 27): the gate panel says what is
true now, after a merge and after main moved; "a reviewer decides" is a neutral badge in the
queue, apart from failing evidence; approving over failing evidence is a named second step,
marked on the change, the goal page and the dashboard; the dashboard's count of changes
awaiting review is the nav's, and both follow the queue live."""

from __future__ import annotations

import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from infraops.models import Goal, GoalVersion, Target
from reviews.live import queue_changed
from reviews.models import Change, ReviewerProfile
from reviews.services import review_decide
from tests.e2e.test_thin_loop import sign_in
from tests.reviews.conftest import SERVING_TOML, CommitOn, criterion_finding, perf_finding
from tests.reviews.test_merge import move_main
from tests.reviews.test_queue import make_change

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

T = TypeVar("T")


def in_thread(work: Callable[[], T]) -> T:
    """Run database work that notifies the pages on a thread of its own: Playwright's event
    loop runs on this one, and the notifications (async_to_sync) refuse to run beside it."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(work).result(timeout=120)


def test_the_panel_says_a_merged_change_merged_and_an_open_one_that_main_moved(
        desktop: Page, live_server: Any, reviewer: User, config_change: Change,
        passing_submit: Callable[..., Change], example_target: Target,
        commit_on: CommitOn) -> None:
    # Before: the merged change's panel said in red "2 of 10 checks failing: merges only when
    # a reviewer approves it"; "Base unmoved" stayed ticked after main moved.
    def merge_one_and_move_main_under_another() -> Change:
        review_decide(change=config_change, reviewer=reviewer, decision="approve")
        waiting = passing_submit(files={"config/serving.toml": SERVING_TOML + "# more\n"})
        move_main(example_target, commit_on, {"README.md": "Someone else's edit.\n"})
        return waiting

    waiting = in_thread(merge_one_and_move_main_under_another)
    config_change.refresh_from_db()
    assert config_change.status == Change.Status.MERGED

    desktop.goto(f"{live_server.url}/reviews/changes/{config_change.pk}/")
    panel = desktop.locator("#gate-checks")
    expect(panel.locator("#merged-summary")).to_contain_text(
        f"Merged as {config_change.merged_commit[:10]} by {reviewer.username}, at ")
    expect(panel.locator("#merged-summary")).to_contain_text("as they stood when it merged")
    expect(panel).not_to_contain_text("merges only when a reviewer approves it")
    expect(panel.locator(".checks-summary.bad")).to_have_count(0)

    desktop.goto(f"{live_server.url}/reviews/changes/{waiting.pk}/")
    base = desktop.locator('#gate-checks [data-check="base"]')
    expect(base.locator(".mark")).to_have_text("✘")
    expect(base).to_contain_text(f"main moved from {waiting.base_commit[:10]}")


def test_a_change_a_reviewer_decides_wears_a_neutral_badge_and_failing_evidence_a_red_one(
        desktop: Page, live_server: Any, auto_goal: GoalVersion,
        passing_submit: Callable[..., Change]) -> None:
    # Before: every change in the queue wore a red "N checks failing" badge.
    spec = auto_goal.spec["criteria"][0]

    def submit_two() -> Change:
        passing_submit(files={"config/serving.toml": SERVING_TOML}, title="Good one")
        return passing_submit(findings=[criterion_finding(spec, passed=False),
                                        perf_finding("latency-bench", "latency_ms")],
                              title="Broken one")

    failing = len(in_thread(submit_two).failing_checks)
    desktop.goto(f"{live_server.url}/reviews/?scope=all")

    good_badge = desktop.locator("tr", has_text="Good one").locator('[data-label="Gate"] .badge')
    bad_badge = desktop.locator("tr", has_text="Broken one").locator('[data-label="Gate"] .badge')
    expect(good_badge).to_have_text("review required")
    assert failing >= 1
    expect(bad_badge).to_have_text(f"{failing} check{'s' * (failing != 1)} failing")
    assert good_badge.evaluate("(e) => getComputedStyle(e).backgroundColor") != \
        bad_badge.evaluate("(e) => getComputedStyle(e).backgroundColor")
    expect(good_badge).not_to_contain_text("failing")


def test_approving_over_a_failed_criterion_is_a_named_second_step_marked_everywhere(
        desktop: Page, live_server: Any, auto_goal: GoalVersion, example_goal: Goal,
        passing_submit: Callable[..., Change]) -> None:
    # Before: it merged with one click on "Approve and merge", with no warning, and the
    # dashboard then said its goal was "34.8% better so far", with no mark.
    spec = auto_goal.spec["criteria"][0]
    change = in_thread(lambda: passing_submit(findings=[
        criterion_finding(spec, passed=False), perf_finding("latency-bench", "latency_ms")]))
    desktop.goto(f"{live_server.url}/reviews/changes/{change.pk}/")

    expect(desktop.get_by_role("button", name="Approve and merge")).to_have_count(0)
    over = len(change.overridable_checks)
    approve_over = f"Approve over {over} failing check{'s' * (over != 1)} and merge"
    override = desktop.locator("#override")
    expect(override).to_contain_text(spec["description"])
    override.get_by_role("button", name=approve_over).click()
    expect(desktop.locator(".message.error")).to_contain_text(
        "give your reason in the override step")
    expect(desktop.locator("#change-status")).to_have_text("awaiting review")
    desktop.get_by_label("Why merge over the failing checks").fill("The criterion's probe "
                                                                   "is flaky on this host.")
    desktop.get_by_role("button", name=approve_over).click()

    expect(desktop.locator("#change-status")).to_have_text("merged")
    expect(desktop.locator("#merged-over")).to_have_text("merged over failing checks")
    decisions = desktop.locator("section", has=desktop.locator("#decisions-title"))
    expect(decisions).to_contain_text("The criterion's probe is flaky on this host.")
    desktop.goto(f"{live_server.url}/goals/{example_goal.pk}/")
    merged = desktop.locator("li", has_text=f"change {change.pk}: ")
    expect(merged.locator(".badge.bad")).to_have_text("merged over failing checks")
    desktop.goto(f"{live_server.url}/")
    expect(desktop.locator("#dashboard-goals tr", has_text=example_goal.name)).to_contain_text(
        "1 change merged over failing checks")


def test_the_dashboards_count_is_the_navs_and_both_follow_the_queue_live(
        live_system: str, page: Page, reviewer: User, example_target: Target) -> None:
    # Before: the dashboard counted every class and stayed put while the nav said (2).
    ReviewerProfile.objects.create(user=reviewer, risk_classes=["numerics"])
    make_change(example_target, "fp16 accumulate", risk_classes=["numerics"])
    make_change(example_target, "Raise max_queue", risk_classes=["production"])
    sign_in(page, live_system, reviewer.username)
    page.goto(f"{live_system}/")
    page.evaluate("window.__notReloaded = true")
    line = page.locator("main").get_by_role("link", name=re.compile("awaiting review"))
    nav = page.locator("header").get_by_role("link", name=re.compile("^Review queue"))
    expect(line).to_have_text("1 change awaiting review")
    expect(nav).to_have_text("Review queue (1)")

    def submit() -> None:
        make_change(example_target, "bf16 softmax", risk_classes=["numerics"])
        queue_changed()

    in_thread(submit)

    expect(line).to_have_text("2 changes awaiting review", timeout=30_000)
    expect(nav).to_have_text("Review queue (2)")
    assert page.evaluate("window.__notReloaded") is True
