"""The run page's chart of trials (agents/charts.py) and its budget bars: drawn on the server,
re-sent with the page's live parts."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from agents.charts import trial_points, trials_svg
from agents.consumers import RunConsumer
from agents.models import AgentRun
from infraops.models import Goal

TRIALS = [{"number": 1, "params": {"batch_size": "8"}, "objective": 0.95},
          {"number": 2, "params": {"batch_size": "16"}, "failed": True},
          {"number": 3, "params": {"batch_size": "4"}, "objective": 1.08},
          {"number": 4, "params": {"batch_size": "32"}, "objective": 0.81},
          {"number": 5, "params": {"batch_size": "2"}}]  # pending: not drawn yet


def test_points_are_the_measured_and_the_failed_trials() -> None:
    assert trial_points(TRIALS) == [(1, 0.95), (2, None), (3, 1.08), (4, 0.81)]
    assert trial_points([{"number": 1, "objective": "x"}, {"number": 2, "objective": -1}]) == []


def test_the_chart_marks_each_trial_the_best_so_far_and_the_base() -> None:
    svg = str(trials_svg(TRIALS))
    assert svg.startswith("<svg") and svg.endswith("</svg>")
    assert len(re.findall(r'<circle class="trial"', svg)) == 3
    assert len(re.findall(r'<path class="failed"', svg)) == 1
    assert "<title>trial 4: 0.81</title>" in svg and "base 1.0" in svg
    best = re.search(r'<polyline class="best" points="([^"]+)"', svg)
    assert best is not None
    heights = [float(p.split(",")[1]) for p in best.group(1).split()]
    assert heights[0] == heights[1] < heights[2]  # 0.95, still 0.95 after 1.08, then 0.81 (lower)
    assert "candidate ÷ base (lower is better)" in svg and ">trial</text>" in svg


def test_no_trial_no_chart() -> None:
    assert str(trials_svg([])) == ""
    assert str(trials_svg([{"number": 1, "params": {}}])) == ""


def test_the_chart_and_the_budget_are_live_parts_of_the_run_page() -> None:
    assert "run-trials" in RunConsumer.refresh_ids and "run-budget" in RunConsumer.refresh_ids


@pytest.mark.django_db
def test_the_run_page_draws_the_trials_and_the_budget_bars(
        client: Client, engineer: User, example_goal: Goal, settings: Any) -> None:
    run = AgentRun.objects.create(
        goal_version=example_goal.versions.latest("number"), target=example_goal.target,
        policy="tuner", started_by=engineer, base_commit=example_goal.target.manifest_commit,
        manifest_sha256=example_goal.target.manifest_sha256, step_count=6, experiment_count=3,
        state={"trials": TRIALS})
    client.force_login(engineer)
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert '<section id="run-trials"><h2>Trials</h2>' in re.sub(r"\s*\n\s*", "", page)
    assert '<svg class="chart-svg"' in page
    assert '<progress value="6" max="50" aria-label="steps used">' in page
    assert '<progress value="3" max="8" aria-label="experiments used">' in page
    live = client.get(f"/runs/{run.pk}/?after=0", HTTP_HX_REQUEST="true").content.decode()
    assert 'id="run-trials" hx-swap-oob="true"' in live
