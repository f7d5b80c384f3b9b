"""The thin loop as users walk it, in a real browser, through real processes:
an engineer starts a tuner run and watches it live; a reviewer approves the change; the
change lands on the example's branch."""

from __future__ import annotations

import re
import time
import tomllib
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from agents.models import AgentRun
from infraops import gitops
from infraops.models import Experiment, Goal, ProbeExecution
from reviews.models import Change
from tests.e2e.conftest import NetworkSwitch

pytestmark = [pytest.mark.e2e, pytest.mark.browser]


def _samples(experiment: Experiment | None) -> str:
    """The experiment's samples of each side, in the order measured: what a failed criterion
    is read against."""
    if experiment is None:
        return "no experiment"
    ran = ProbeExecution.objects.filter(experiment=experiment).order_by("id")
    return "\n".join(f"{e.side} repeat {e.repeat_index} ({e.wall_seconds:.2f} s): "
                     f"{e.stdout.strip()[-200:]}" for e in ran)


def sign_in(page: Page, base: str, username: str) -> None:
    page.goto(f"{base}/accounts/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill("correct horse battery")
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("link", name="Review queue")).to_be_visible()


def sign_out(page: Page) -> None:
    page.get_by_role("button", name="Sign out").click()
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()


def test_an_engineer_runs_the_tuner_live_and_a_reviewer_approves_the_merge(
    live_system: str, page: Page, example_goal: Goal, engineer: User, reviewer: User
) -> None:
    base = live_system
    target = example_goal.target
    network = NetworkSwitch(page)
    sign_in(page, base, engineer.username)
    # The targets list (the goals table links each goal's target too).
    page.locator("#dashboard-targets").get_by_role("link", name=target.name).click()
    page.get_by_role("button", name="Start a run").click()
    expect(page).to_have_url(re.compile(r"/runs/\d+/$"))
    # A marker that survives only while the page is not reloaded: the steps must arrive live.
    page.evaluate("window.__notReloaded = true")
    # The dashboard, in a tab of its own, follows the run to its end without a reload.
    dashboard = page.context.new_page()
    dashboard.goto(f"{base}/")
    dashboard.evaluate("window.__notReloaded = true")
    expect(dashboard.locator("#dashboard-runs")).to_contain_text("running")

    events = page.locator("#run-events")
    expect(events).to_contain_text(re.compile(r"Experiment \d+ queued"), timeout=60_000)
    # Another tab watches the first experiment to its end, without a reload: status, findings
    # and the A/B chart arrive when it finishes (the socket has the page re-read its parts).
    watched = Experiment.objects.order_by("pk").first()
    assert watched is not None
    watcher = page.context.new_page()
    watcher.goto(f"{base}/experiments/{watched.pk}/")
    watcher.evaluate("window.__notReloaded = true")
    assert watcher.locator("#experiment-status").inner_text() in ("queued", "running")
    expect(watcher.locator("#experiment-status")).to_have_text("succeeded", timeout=180_000)
    expect(watcher.locator("ol.findings")).to_contain_text("latency_ms", timeout=30_000)
    expect(watcher.locator("#chart-ab .main-svg").first).to_be_visible(timeout=30_000)
    assert watcher.evaluate("window.__notReloaded") is True
    watcher.close()
    # The network drops for a few seconds while the run logs, then comes back: the sockets
    # reconnect and the page fetches what it missed (the exact count of rows is checked at
    # the end).
    opened = network.opened
    network.down()
    page.wait_for_timeout(4_000)
    network.up()
    deadline = time.monotonic() + 90
    while network.opened < opened + 2 and time.monotonic() < deadline:  # nav and run sockets
        page.wait_for_timeout(250)
    assert network.opened >= opened + 2, "the page's sockets never reconnected"
    expect(events).to_contain_text("Submitted the best configuration", timeout=180_000)
    expect(page.locator("#run-status")).to_have_text("succeeded")
    assert page.evaluate("window.__notReloaded") is True
    expect(dashboard.locator("#dashboard-runs")).to_contain_text("succeeded", timeout=30_000)
    assert dashboard.evaluate("window.__notReloaded") is True
    dashboard.close()
    # The budget and the controls follow the run live too: no Pause on a finished run.
    expect(page.get_by_role("button", name="Pause")).to_have_count(0)

    run = AgentRun.objects.get()
    assert run.status == AgentRun.Status.SUCCEEDED
    assert run.goal_version.number == example_goal.current_version
    seqs = list(run.events.values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1))
    expect(page.locator("#run-budget tr").nth(1)).to_contain_text(str(run.step_count))
    shown = page.locator("#run-events li").count()
    assert shown == len(seqs), "every event row reached the page exactly once"
    # Every experiment ran sandboxed, interleaved, candidate and baseline.
    assert Experiment.objects.filter(status="succeeded").count() == run.experiment_count >= 1
    ran = ProbeExecution.objects.filter(experiment__runs=run).order_by("id")
    sides = list(ran.filter(repeat_index__gte=0).values_list("side", flat=True)[:4])
    # No warm-up by default (a first-run outlier is found in the samples); the first
    # executions are samples, interleaved ABBA.
    assert not ran.filter(repeat_index__lt=0).exists()
    assert list(ran.values_list("repeat_index", flat=True)[:4]) == [0, 0, 1, 1]
    assert sides == ["baseline", "candidate", "candidate", "baseline"]  # ABBA

    # The experiment page shows the probes' output, kept as log rows.
    first = Experiment.objects.order_by("pk").first()
    assert first is not None
    problems: list[str] = []
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    page.goto(f"{base}/experiments/{first.pk}/")
    expect(page.locator("#experiment-log")).to_contain_text("latency=")
    # The feedback, and its A/B chart drawn by our own plotly.js under the strict CSP.
    expect(page.locator("ol.findings")).to_contain_text("latency_ms")
    expect(page.locator("#chart-ab .main-svg").first).to_be_visible()
    assert problems == [], problems
    expect(page.locator("#experiment-log li")).to_have_count(first.logs.count())
    page.go_back()

    change = Change.objects.get()
    assert change.status == Change.Status.PENDING_REVIEW
    # Configurations are written as people write them, never as Python dicts.
    assert not run.events.filter(message__contains="{'").exists()
    assert "{'" not in change.title + change.hypothesis
    assert "production" in change.risk_categories
    page.get_by_role("link", name=f"open change {change.pk}").first.click()
    expect(page.locator("table.diff")).to_contain_text("batch_size")
    expect(page.locator(".risk-note").first).to_contain_text("production")
    # The engineer who started the run has no way to approve it.
    expect(page.get_by_role("button", name="Approve and merge")).to_have_count(0)
    sign_out(page)

    sign_in(page, base, reviewer.username)
    page.goto(f"{base}/reviews/")
    page.get_by_role("link", name=change.title).click()
    change.refresh_from_db()  # the measurement decided: nothing for the approval to go over
    assert not change.overridable_checks, "\n".join(
        [f"{c['title']}: {c['detail']}" for c in change.overridable_checks]
        + [_samples(change.experiment)])
    page.get_by_label("Comment (goes back to the agent)").fill("Matches the batch sweep.")
    page.get_by_role("button", name="Approve and merge").click()
    expect(page.locator("#change-status")).to_have_text(re.compile("merged", re.I))

    change.refresh_from_db()
    origin = target.repo_url
    tip = gitops.rev_parse(target.clone_path, "refs/heads/main")
    assert change.merged_commit == tip
    # push_on_merge: the example's own branch moved too, to the approved configuration.
    merged = gitops.read_file(Path(origin), "refs/heads/main", "config/serving.toml")
    assert merged is not None
    best = change.evidence["trials"]
    chosen = min((t for t in best if t.get("experiment")), key=lambda t: t["objective"])
    assert tomllib.loads(merged.decode())["batch_size"] == int(chosen["params"]["batch_size"])

    # The goal's evolution: the base and the merged change, drawn with its interval.
    page.goto(f"{base}/goals/{example_goal.pk}/")
    expect(page.locator("svg.chart-svg circle")).to_have_count(2)
    expect(page.locator("table").first).to_contain_text(f"change {change.pk}")
    # The dashboard's line about the queue opens the queue.
    page.goto(f"{base}/")
    page.get_by_role("link", name=re.compile("awaiting review")).click()
    expect(page).to_have_url(f"{base}/reviews/")
