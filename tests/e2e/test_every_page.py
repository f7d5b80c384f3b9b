"""Every page of the product, read as its users would on a phone (390 px wide) and without
JavaScript: nothing overflows the screen sideways, and what a page is for is there in the
HTML the server sent, forms included. Filled with what makes pages wide: long names, long
log lines, diffs, tool calls, traces with many threads."""

from __future__ import annotations

import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from playwright.sync_api import Browser, Page, Route, expect

from agents.events import run_event
from agents.models import AgentRun, Hypothesis, Step
from infraops.models import Experiment, Goal
from reviews.models import Change
from skeletons.models import Skeleton, SkeletonEvidence, SkeletonUse
from tests.e2e.test_thin_loop import sign_in

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

LONG = "a_rather_long_identifier_without_any_place_to_break_it_" * 4
SHORTER = LONG[:150]  # for fields of at most 200 characters
DIFF = ("--- a/config/serving.toml\n+++ b/config/serving.toml\n@@ -1,2 +1,2 @@\n"
        f"-batch_size = 4  # {LONG}\n+batch_size = 8  # {LONG}\n")
TIMELINE = {"unit": "ms", "duration": 2.0, "threads": ["MainThread", "mooncake", LONG[:60]],
            "spans": [[0, "dispatch", 0.0, 1.0], [1, "kv_transfer", 1.0, 1.5]],
            "waits": [[1, "gil_wait", 0.1, 1.0]], "idle": [[0, 1.0, 2.0]],
            "overlap": [], "left_out": 0}


def world(goal: Goal, engineer: User) -> dict[str, Any]:
    """A run with steps, events and a ledger; its experiment with findings, charts, a
    timeline and criteria; the change it made, awaiting review; a merged one before it."""
    target = goal.target
    comparison = {"probe": goal.probe, "metric": goal.metric, "variant": f"batch_size=8,{LONG}",
                  "case": "", "unit": "ms", "baseline_median": 10.0, "candidate_median": 9.0,
                  "ratio": 0.9, "baseline_n": 5, "candidate_n": 5}
    experiment = Experiment.objects.create(
        target=target, candidate_commit="b" * 40, baseline_commit="a" * 40,
        status=Experiment.Status.SUCCEEDED, probes=[goal.probe],
        criteria=[{"id": 1, "name": SHORTER, "description": f"{goal.probe}.{goal.metric} <= 9"}],
        summary={"comparisons": [comparison]},
        feedback={
            "verdict": "faster", "counts": {"fail": 0, "warn": 1, "info": 0, "pass": 1},
            "findings": [
                {"severity": "pass", "layer": "performance", "kind": "faster",
                 "title": f"{goal.probe} {goal.metric} improved", "detail": LONG,
                 "evidence": {"comparison": comparison | {"ci_low": 0.85, "ci_high": 0.95}}},
                {"severity": "warn", "layer": "criteria", "kind": "criterion",
                 "title": "criterion", "detail": LONG,
                 "evidence": {"criterion": 1, "verdict": {"passed": True, "detail": LONG}}}],
            "distributions": [{"label": LONG, "unit": "ms", "baseline": [10.0, 10.2],
                               "candidate": [9.0, 9.1]}],
            "timelines": {f"{goal.probe} [default, candidate]": TIMELINE},
            "spans": {f"{goal.probe} [default]": [
                {"name": LONG, "thread": "MainThread", "count": 3, "total_us": 1000.0,
                 "p50_us": 300.0, "p95_us": 400.0}]},
            "next_steps": [LONG], "agent_text": LONG})
    run = AgentRun.objects.create(
        goal_version=goal.versions.latest("number"), target=target, policy="tuner",
        started_by=engineer, base_commit=target.manifest_commit,
        manifest_sha256=target.manifest_sha256, status=AgentRun.Status.RUNNING, step_count=1,
        experiment_count=1)
    run.experiments.add(experiment)
    Step.objects.create(run=run, number=1, summary=f"Tried {LONG}", verdict=SHORTER,
                        experiment=experiment,
                        calls=[{"name": "run_experiment", "ok": True, "content": LONG,
                                "arguments": {"knobs": {"batch_size": "8"}, "note": LONG}}])
    Hypothesis.objects.create(run=run, title=SHORTER, rationale=LONG)
    for n in range(3):
        run_event(run_id=run.pk, kind="log", message=f"line {n}: {LONG}")
    merged = Change.objects.create(
        target=target, goal=goal, experiment=experiment, title="An earlier change",
        hypothesis="h", base_commit="a" * 40, head_commit="c" * 40, diff=DIFF,
        diff_sha256=Change.hash_diff(DIFF), status=Change.Status.MERGED,
        merged_at=timezone.now() - timedelta(days=1))
    change = Change.objects.create(
        target=target, goal=goal, goal_version=goal.versions.latest("number"),
        experiment=experiment, title=f"Raise batch_size {SHORTER}", hypothesis=LONG,
        base_commit="a" * 40, head_commit="b" * 40, diff=DIFF, diff_sha256=Change.hash_diff(DIFF),
        author_label=f"run {run.pk}", risk_classes=["production"])
    run.changes.add(change)
    skeleton = Skeleton.objects.create(
        slug="a-long-skeleton", name=f"Skeleton {SHORTER}", summary=LONG, status="reviewed",
        applicability=[{"field": "op_class", "op": "in", "value": [SHORTER]}],
        applicability_prose=LONG, transformation=f"-{LONG}\n+{LONG}", resource_constraints=LONG,
        provenance=SHORTER, provenance_url=f"https://example.com/{LONG[:150]}")
    SkeletonUse.objects.create(skeleton=skeleton, run=run, change=change, note=LONG)
    SkeletonEvidence.objects.create(skeleton=skeleton, change=merged, experiment=experiment,
                                    note=SHORTER)
    return {"run": run, "experiment": experiment, "change": change, "merged": merged,
            "skeleton": skeleton}


@pytest.fixture
def pages(live_system: str, example_goal: Goal, engineer: User) -> Iterator[dict[str, str]]:
    # On a thread of its own: Playwright's event loop runs on this one, and the events'
    # notifications (async_to_sync) refuse to run beside it.
    with ThreadPoolExecutor(max_workers=1) as pool:
        made = pool.submit(world, example_goal, engineer).result(timeout=60)
    yield {
        "dashboard": "/",
        "target": f"/targets/{example_goal.target.name}/",
        "goal": f"/goals/{example_goal.pk}/",
        "run": f"/runs/{made['run'].pk}/",
        "experiment": f"/experiments/{made['experiment'].pk}/",
        "queue": "/reviews/",
        "change": f"/reviews/changes/{made['change'].pk}/",
        "skeletons": "/skeletons/",
        "skeleton": f"/skeletons/{made['skeleton'].slug}/",
        "not found": "/no/such/page/",
    }


def overflow(page: Page) -> list[str]:
    """When the page scrolls sideways: the outermost elements that reach past the right edge
    of the screen (inside a box that scrolls or clips, an element is that box's business)."""
    return list(page.evaluate("""() => {
      const width = document.documentElement.clientWidth;
      if (document.documentElement.scrollWidth <= width + 1) return [];
      const contained = (e) => {
        for (let up = e.parentElement; up && up !== document.body; up = up.parentElement) {
          if (getComputedStyle(up).overflowX !== "visible") return true;
        }
        return false;
      };
      const wide = Array.from(document.querySelectorAll("body *")).filter(
        (e) => e.getBoundingClientRect().right > width + 1 && !contained(e));
      return wide.filter((e) => !wide.includes(e.parentElement)).slice(0, 8).map(
        (e) => `${e.tagName.toLowerCase()}#${e.id}.${e.getAttribute("class") || ""}`);
    }"""))


def test_no_page_scrolls_sideways_on_a_phone(
        browser: Browser, live_system: str, pages: dict[str, str], engineer: User) -> None:
    context = browser.new_context(viewport={"width": 390, "height": 844})
    page = context.new_page()
    sign_in(page, live_system, engineer.username)
    wide = {}
    for name, path in pages.items():
        page.goto(f"{live_system}{path}")
        page.wait_for_load_state("networkidle")
        if found := overflow(page):
            wide[name] = found
    context.close()

    assert wide == {}


def test_every_page_says_what_it_is_for_without_javascript(
        browser: Browser, live_system: str, pages: dict[str, str], engineer: User) -> None:
    context = browser.new_context(java_script_enabled=False)
    page = context.new_page()
    sign_in(page, live_system, engineer.username)
    expected = {
        "dashboard": ["Goals", "Recent runs", "10.0% better so far"],
        "target": ["Boundary", "Start another run"],
        "goal": ["An earlier change"],
        "run": ["line 2:", "Tried", "run_experiment", "Send to the agent", "Pause"],
        "experiment": ["improved", "Threads worked at the same time for", "Acceptance criteria",
                       "Spans per thread"],
        "queue": ["Raise batch_size"],
        "change": ["batch_size = 8", "production"],
        "skeletons": ["Skeleton a_rather", "op_class is one of", "Search"],
        "skeleton": ["When it applies", "What to change", "Evidence", "An earlier change",
                     "Applied 1 time"],
        "not found": ["not found"],
    }
    missing = {}
    for name, path in pages.items():
        page.goto(f"{live_system}{path}")
        text = page.locator("main").inner_text().lower()
        if lost := [want for want in expected[name] if want.lower() not in text]:
            missing[name] = lost
    # The controls are forms: pausing the run works with a plain POST.
    page.goto(f"{live_system}{pages['run']}")
    page.get_by_role("button", name="Pause").click()
    expect(page.locator("#run-status")).to_have_text("paused")
    context.close()

    assert missing == {}


def test_starting_a_run_says_so_while_it_starts(
        page: Page, live_system: str, pages: dict[str, str], engineer: User) -> None:
    sign_in(page, live_system, engineer.username)
    page.goto(f"{live_system}{pages['target']}")
    # The start answers "204 No Content": the browser stays on the page, as it does while a
    # slow start (a fetch of the target's upstream) is on its way.
    sent: list[str] = []

    def answer(route: Route) -> None:
        sent.append(route.request.method)
        route.fulfill(status=204)

    page.route("**/goals/*/runs/", answer)
    button = page.get_by_role("button", name="Start another run")
    button.click()

    status = page.get_by_role("status").filter(has_text="Starting the run")
    expect(status).to_have_text(re.compile(r"fetching the target's upstream… \d+ s$"))
    expect(button).to_be_disabled()
    button.click(force=True)  # a second click sends nothing
    assert sent == ["POST"]
