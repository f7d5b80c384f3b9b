"""The showcase as a newcomer sees it, in a real browser, through real processes: the demo
target loaded with its goals, a run started on each (the three tuners, and the LLM goal
against the demo's scripted model on a local OpenAI-compatible endpoint), the dashboard
following them to their end without a reload, the four changes waiting in the review queue
with their risk reasons, the concurrency experiment's timeline, and the skeleton library;
then what each run found, as the workers stored it. The suite runs these goals to their end
only here (tests/agents/test_showcase.py checks how they start)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from playwright.sync_api import Page, expect

from agents.models import AgentRun
from agents.scripted.demo import MODEL, DemoModel
from agents.scripted.endpoint import OpenAIStub
from reviews.models import Change
from tests.agents.test_showcase import BY_THE_LLM, NUMERICS, PERFORMANCE
from tests.e2e.test_thin_loop import sign_in

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

SHOWCASE_DEADLINE = 600_000  # ms: four runs, a dozen experiments, on a loaded 2-core machine


@pytest.fixture
def demo_model() -> Iterator[OpenAIStub]:
    with OpenAIStub(fallback=DemoModel()) as endpoint:
        yield endpoint


@pytest.fixture
def live_env(demo_model: OpenAIStub) -> dict[str, str]:
    return {"OPENAI_BASE_URL": demo_model.base_url, "OPENAI_API_KEY": "demo",
            "INFRAOPS_MODEL": MODEL}


# The page's own deadline is SHOWCASE_DEADLINE: pytest's per-test limit (300 s) must not cut
# it shorter.
@pytest.mark.timeout(SHOWCASE_DEADLINE // 1000 + 120)
def test_a_newcomer_watches_the_showcase_find_the_three_problems(
        live_system: str, page: Page, engineer: User, reviewer: User, demo_model: OpenAIStub,
        settings: Any, skeleton_seeds: None) -> None:
    settings.OPENAI_BASE_URL, settings.INFRAOPS_MODEL = demo_model.base_url, MODEL
    User.objects.filter(pk=engineer.pk).update(is_superuser=True)
    call_command("load_example", "demo-kernels", stdout=StringIO())
    call_command("start_runs", "demo-kernels", stdout=StringIO())
    assert AgentRun.objects.count() == 4

    sign_in(page, live_system, engineer.username)
    page.evaluate("window.__notReloaded = true")
    goals = page.locator("#dashboard-goals")
    for name in ("Numerics:", "Concurrency:", "Performance:", "Numerics, by the LLM agent:"):
        expect(goals).to_contain_text(name)
    runs = page.locator("#dashboard-runs")
    # The runs end on their own, and the dashboard follows them there without a reload.
    expect(runs.get_by_text("succeeded", exact=True)).to_have_count(
        4, timeout=SHOWCASE_DEADLINE)
    assert page.evaluate("window.__notReloaded") is True
    assert demo_model.errors == []

    changes = {c.title: c for c in Change.objects.all()}
    assert len(changes) == 4 and all(c.status == "pending_review" for c in changes.values())
    page.goto(f"{live_system}/reviews/")
    table = page.locator("table.queue")
    expect(table.locator("tbody tr")).to_have_count(4)
    expect(table).to_contain_text("numerics")
    expect(table).to_contain_text("concurrency")

    # The concurrency run's first experiment: the spans that never overlap, on a timeline.
    concurrency = AgentRun.objects.get(goal_version__goal__name__startswith="Concurrency")
    first = concurrency.experiments.order_by("pk").first()
    assert first is not None
    page.goto(f"{live_system}/experiments/{first.pk}/")
    expect(page.locator("ol.findings")).to_contain_text(re.compile("kv_transfer never overlaps"))
    timeline = page.locator(".chart", has_text="Timeline: prefill-kv [scenario=prefill_kv")
    expect(timeline.first.locator(".main-svg").first).to_be_visible()

    page.goto(f"{live_system}/skeletons/")
    expect(page.locator("main")).to_contain_text("GIL")

    # What each run found, as the workers stored it: these are the suite's only runs of the
    # showcase's four goals to their end.
    assert concurrency.status == AgentRun.Status.SUCCEEDED, concurrency.stop_reason
    change = Change.objects.get(runs=concurrency)
    assert "+RELEASE_GIL = True" in change.diff and "concurrency" in change.risk_classes
    # The base's feedback named the spans that never overlap, the other thread, the gap.
    never = [f for f in first.feedback["findings"] if f["kind"] == "no-overlap"
             and "kv_transfer never overlaps" in f["title"] and "baseline" in f["title"]]
    assert never and "thread mooncake sat idle" in never[0]["detail"], first.feedback["agent_text"]

    performance = AgentRun.objects.get(goal_version__goal__name=PERFORMANCE)
    change = Change.objects.get(runs=performance)
    assert "+MERGE_TILES = True" in change.diff and "numerics" in change.risk_classes
    assert change.experiment is not None
    # Counted, not only timed: the merged tiles run fewer instructions.
    counted = [f for f in change.experiment.feedback["findings"]
               if f["kind"] == "perf-comparison" and "instructions improved" in f["title"]]
    assert counted, change.experiment.feedback["agent_text"]

    numerics = AgentRun.objects.get(goal_version__goal__name=NUMERICS)
    change = Change.objects.get(runs=numerics)
    # The least error of the precisions it tried (README.md says so): ieee's, under tf32x3's.
    assert '+INPUT_PRECISION = "ieee"' in change.diff and "numerics" in change.risk_classes, (
        # Once (a fresh clone, 2026-12-08) tf32x3 was submitted: say what each trial measured.
        "\n".join(f"{t['params']}: objective {t.get('objective')}, experiment "
                  f"{t.get('experiment')}, failed {t.get('failed', False)}, lost {t.get('lost')}"
                  for t in numerics.state["trials"])
        + "\n" + "\n".join(numerics.events.order_by("seq").values_list("message", flat=True)))
    # The error fell by orders of magnitude: from about 3e-2 at 4096 merges to under 1e-4.
    trials = {t["params"]["input_precision"]: t for t in numerics.state["trials"]}
    assert trials["tf32x3"]["candidate"] < 1e-4 < trials["tf32x3"]["baseline"], trials

    by_the_llm = AgentRun.objects.get(goal_version__goal__name=BY_THE_LLM)
    assert "INPUT_PRECISION tf32 -> tf32x3" in by_the_llm.stop_reason
    change = Change.objects.get(runs=by_the_llm)
    assert '+INPUT_PRECISION = "tf32x3"' in change.diff and "numerics" in change.risk_classes
    # It read the failing case before it edited anything, and checked the fix.
    names = [c["name"] for s in by_the_llm.steps.order_by("number") for c in s.calls]
    assert names == ["list_probes", "run_experiment", "case_detail", "search_code",
                     "read_file", "edit_file", "run_experiment", "submit_change", "finish"]
