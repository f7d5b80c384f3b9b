"""An experiment page read in a real browser, live to its end: the concurrency case of
docs/product.md (a transfer thread blocked while the main thread holds the GIL) runs on the
worker while a viewer watches; its A/B chart, its trace as a per-thread timeline and its
criteria table arrive without a reload."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from infraops.experiments.services import experiment_request
from infraops.services.targets import target_register
from tests.conftest import case_source, make_origin, members_of_new_target
from tests.e2e.test_thin_loop import sign_in

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

CRITERION = {"kind": "relation", "probe": "prefill-kv", "metric": "step_ms",
             "variant": "scenario=prefill_kv", "reference_variant": "scenario=prefill",
             "comparison": "<=", "value": 0.05,
             "description": "step_ms [scenario=prefill_kv] vs [scenario=prefill] <= +5%",
             "name": "prefill+kv within 5% of prefill"}


def test_a_viewer_reads_the_timeline_and_the_criteria_as_the_experiment_ends(
    live_system: str, page: Page, viewer: User, tmp_path: Path
) -> None:
    origin = make_origin(tmp_path, case_source(tmp_path, "kv-transfer-gil"), "kv.git")
    target = members_of_new_target(target_register(
        name="kv-transfer-gil", repo_url=str(origin), base_branch="main"))
    experiment = experiment_request(
        target=target, candidate_commit=target.manifest_commit,
        baseline_commit=target.manifest_commit, probes=["prefill-kv"], criteria=[CRITERION])
    sign_in(page, live_system, viewer.username)
    page.goto(f"{live_system}/experiments/{experiment.pk}/")
    page.evaluate("window.__notReloaded = true")
    # Before it ends: the criterion is listed, waiting for its verdict.
    expect(page.locator("table.criteria")).to_contain_text("judged when the experiment ends")

    expect(page.locator("#experiment-status")).to_have_text("succeeded", timeout=240_000)
    expect(page.locator("#chart-ab .main-svg").first).to_be_visible(timeout=30_000)
    timeline = page.locator(".chart", has_text="Timeline: prefill-kv [scenario=prefill_kv, "
                                               "candidate]")
    expect(timeline.locator(".main-svg").first).to_be_visible()
    # One row per thread, the blocked time drawn as waits, the caption in words.
    expect(timeline).to_contain_text("MainThread")
    expect(timeline).to_contain_text("mooncake")
    expect(timeline).to_contain_text("waiting (blocked)")
    expect(page.locator("figure.chart-figure figcaption").first).to_contain_text(
        "Threads worked at the same time for")
    row = page.locator("table.criteria tbody tr").first
    expect(row).to_contain_text("prefill+kv within 5% of prefill")
    expect(row.locator(".badge")).to_have_text("failed")
    expect(row).to_contain_text("scenario gap")
    assert page.evaluate("window.__notReloaded") is True
