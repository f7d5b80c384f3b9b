"""The goal page: the metric across the base and every merged change (the evolution chart,
with intervals), each goal version's changes in words, its runs and merged changes."""

from __future__ import annotations

import html
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from agents.goals import evolution
from agents.models import AgentRun
from infraops.models import Experiment, Goal, Target
from infraops.services.goals import goal_snapshot, spec_changes
from reviews.models import Change
from tests.factories import AgentRunFactory, ChangeFactory, ExperimentFactory

pytestmark = pytest.mark.django_db


def merged_change(goal: Goal, n: int, base: float, head: float, ci: tuple[float, float],
                  **extra: Any) -> Change:
    comparison = {"probe": goal.probe, "metric": goal.metric, "variant": "", "case": "",
                  "unit": "ms", "baseline_median": base, "candidate_median": head,
                  "ratio": head / base, "ci_low": ci[0], "ci_high": ci[1]}
    experiment = ExperimentFactory.create(
        target=goal.target, candidate_commit=f"{n}" * 40, baseline_commit="a" * 40,
        status=Experiment.Status.SUCCEEDED,
        feedback={"findings": [{"title": f"{goal.probe} {goal.metric} improved",
                                "evidence": {"comparison": comparison}}]})
    return ChangeFactory.create(
        goal=goal, experiment=experiment, title=f"change {n}", base_commit="a" * 40,
        head_commit=f"{n}" * 40, diff="", status=Change.Status.MERGED,
        merged_at=timezone.now() + timedelta(minutes=n), **extra)


def test_the_evolution_is_the_base_then_each_merged_change_in_merge_order(
        example_goal: Goal) -> None:
    second = merged_change(example_goal, 2, 9.0, 8.1, (0.88, 0.92))
    first = merged_change(example_goal, 1, 10.0, 9.0, (0.85, 0.95))
    ChangeFactory.create(goal=example_goal, title="pending")  # not merged: not a version

    points = evolution(example_goal)

    assert [(p.label, p.median, p.change) for p in points] == [
        ("v0 (base)", 10.0, None), (f"v1 (change {first.pk})", 9.0, first.pk),
        (f"v2 (change {second.pk})", 8.1, second.pk)]
    assert points[1].low == pytest.approx(8.5) and points[1].high == pytest.approx(9.5)
    assert points[2].low == pytest.approx(9.0 * 0.88) and points[0].low is None


def test_the_goal_page_draws_it_with_units_and_links(client: Client, engineer: User,
                                                     example_goal: Goal) -> None:
    change = merged_change(example_goal, 1, 10.0, 9.0, (0.85, 0.95))
    client.force_login(engineer)

    page = client.get(f"/goals/{example_goal.pk}/").content.decode()

    assert '<svg class="chart-svg"' in page and "latency_ms (ms), median" in page
    assert page.count('<circle class="trial"') == 2 and '<line class="interval"' in page
    assert f'<a href="/reviews/changes/{change.pk}/">change {change.pk}</a>' in page
    assert "8.5000 to 9.5000 ms" in page
    target_page = client.get(f"/targets/{example_goal.target.name}/").content.decode()
    assert f'<a href="/goals/{example_goal.pk}/">' in target_page


def test_without_merged_changes_the_page_says_so(client: Client, engineer: User,
                                                 example_goal: Goal) -> None:
    client.force_login(engineer)
    page = client.get(f"/goals/{example_goal.pk}/").content.decode()
    assert "No merged change with a measurement of latency_ms yet" in page


def test_each_version_says_what_it_changed(client: Client, engineer: User,
                                           example_goal: Goal) -> None:
    example_goal.boundary.max_experiments = 12
    example_goal.boundary.save()
    goal_snapshot(goal=example_goal, user=engineer)
    client.force_login(engineer)

    page = client.get(f"/goals/{example_goal.pk}/").content.decode()

    assert "boundary.max_experiments: 8 → 12" in page
    assert "the first version" in page


def test_spec_changes_name_added_removed_and_changed_settings() -> None:
    before = {"boundary": {"max_steps": 40, "editable_paths": ["config/**"]},
              "criteria": [{"id": 1, "name": "a"}]}
    after = {"boundary": {"max_steps": 50, "editable_paths": ["config/**", "src/**"]},
             "criteria": [{"id": 9, "name": "a"}, {"id": 10, "name": "b"}], "auto_merge": True}
    assert spec_changes(before, after) == [
        "added auto_merge: True",
        "boundary.editable_paths: config/** → config/**, src/**",
        "boundary.max_steps: 40 → 50",
        "added criteria[2].name: b"]
    assert spec_changes(before, before) == ["no setting changed"]
    assert spec_changes(None, after) == ["the first version"]


def test_an_experiment_page_links_its_runs_and_the_change_it_is_the_evidence_of(
        client: Client, engineer: User, example_goal: Goal) -> None:
    change = merged_change(example_goal, 1, 10.0, 9.0, (0.85, 0.95))
    experiment = change.experiment
    assert experiment is not None
    run = AgentRunFactory.create(goal=example_goal, started_by=engineer,
                                 base_commit="a" * 40, manifest_sha256="b" * 64)
    run.experiments.add(experiment)
    client.force_login(engineer)

    page = client.get(f"/experiments/{experiment.pk}/").content.decode()

    assert f'Asked by <a href="/runs/{run.pk}/">run {run.pk}</a>.' in page
    assert f'The evidence of <a href="/reviews/changes/{change.pk}/">change {change.pk}</a>' in page


def test_an_engineer_starts_a_run_from_the_goal_page(client: Client, engineer: User,
                                                     example_goal: Goal) -> None:
    """A newcomer reading a goal's progress had to go back to the target page to start a run."""
    client.force_login(engineer)

    page = client.get(f"/goals/{example_goal.pk}/").content.decode()

    assert f'action="/goals/{example_goal.pk}/runs/"' in page
    assert ">Start a run</button>" in page


def test_the_goal_page_says_when_a_run_is_active_and_hides_the_start_from_viewers(
        client: Client, engineer: User, viewer: User, example_goal: Goal) -> None:
    run = AgentRunFactory.create(goal=example_goal, started_by=engineer)
    client.force_login(engineer)

    page = client.get(f"/goals/{example_goal.pk}/").content.decode()

    assert ">Start another run</button>" in page and f"Run {run.pk}</a> is running" in page
    client.force_login(viewer)
    page = client.get(f"/goals/{example_goal.pk}/").content.decode()
    assert f"/goals/{example_goal.pk}/runs/" not in page


def test_the_dashboard_marks_the_goals_that_cannot_run_here(
        client: Client, engineer: User, demo: Target, settings: Any) -> None:
    """The demo's LLM and GPU goals looked like the three that run anywhere."""
    settings.OPENAI_BASE_URL = ""
    client.force_login(engineer)

    rows = dashboard_goal_rows(client)

    assert {name for name, row in rows.items() if "cannot-run" in row} == {
        "Numerics, by the LLM agent: the parallel merge matches the sequential path",
        "Numerics on the GPU: the Triton merge stays close to float64"}
    assert "needs an LLM endpoint: none here" in rows[
        "Numerics, by the LLM agent: the parallel merge matches the sequential path"]
    assert "needs a worker with gpu: none here" in rows[
        "Numerics on the GPU: the Triton merge stays close to float64"]
    assert not any("needs " in row for name, row in rows.items() if "GPU" not in name
                   and "LLM" not in name)


def test_a_goal_whose_need_is_met_is_marked_but_not_greyed(
        client: Client, engineer: User, demo: Target, settings: Any) -> None:
    settings.OPENAI_BASE_URL = "http://127.0.0.1:9/v1"
    client.force_login(engineer)

    row = dashboard_goal_rows(client)[
        "Numerics, by the LLM agent: the parallel merge matches the sequential path"]

    assert "cannot-run" not in row and "needs an LLM endpoint</span>" in row


def dashboard_goal_rows(client: Client) -> dict[str, str]:
    """The dashboard's goals table, row by row, by the goal's name."""
    page = client.get("/").content.decode()
    table = page[page.index('id="dashboard-goals"'):page.index("</table>",
                                                               page.index('id="dashboard-goals"'))]
    rows = {}
    for row in table.split("<tr")[2:]:
        name = row.split("</a>", 1)[0].rsplit(">", 1)[1]
        rows[html.unescape(name)] = row
    return rows


def test_a_run_a_person_stopped_reads_stopped_in_the_run_lists(
        client: Client, engineer: User, example_goal: Goal) -> None:
    """'stop' submits the best so far and ends the run 'succeeded': the dashboard, the target
    page and the goal page said so, as if it had run to its end."""
    stopped = AgentRunFactory.create(
        goal=example_goal, started_by=engineer, status=AgentRun.Status.SUCCEEDED,
        state={"stop": True, "stopped_by": "erin"}, finished_at=timezone.now(),
        stop_reason="stopped by erin, best so far submitted: change 4")
    ended = AgentRunFactory.create(goal=example_goal, started_by=engineer,
                                   status=AgentRun.Status.SUCCEEDED, finished_at=timezone.now())
    client.force_login(engineer)

    for path in ("/", f"/targets/{example_goal.target.name}/", f"/goals/{example_goal.pk}/"):
        page = client.get(path).content.decode()
        row = page[page.index(f">run {stopped.pk}</a>"):]
        assert row[:row.index("</tr>")].count('<span class="badge stopped">stopped</span>') == 1
        row = page[page.index(f">run {ended.pk}</a>"):]
        assert '<span class="badge succeeded">succeeded</span>' in row[:row.index("</tr>")]
