"""The run page's chart of trials (agents/charts.py) and its budget bars: drawn on the server,
re-sent with the page's live parts."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from agents.charts import progress_svg, trial_points, trials_svg
from agents.consumers import RunConsumer
from agents.models import AgentRun, Step
from agents.templatetags.agent_runs import run_experiments
from infraops.models import Goal
from tests.factories import AgentRunFactory, ExperimentFactory

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
    run = AgentRunFactory.create(goal=example_goal, started_by=engineer, policy="tuner",
                                 step_count=6, experiment_count=3, state={"trials": TRIALS})
    client.force_login(engineer)
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert '<section id="run-trials"><h2>Trials</h2>' in re.sub(r"\s*\n\s*", "", page)
    assert '<svg class="chart-svg"' in page
    assert '<progress value="6" max="50" aria-label="steps used">' in page
    assert '<progress value="3" max="8" aria-label="experiments used">' in page
    live = client.get(f"/runs/{run.pk}/?after=0", HTTP_HX_REQUEST="true").content.decode()
    assert 'id="run-trials" hx-swap-oob="true"' in live


def best_line(svg: str) -> list[float]:
    """The heights of the best-so-far line's points (SVG: smaller is higher up)."""
    best = re.search(r'<polyline class="best" points="([^"]+)"', svg)
    assert best is not None
    return [float(p.split(",")[1]) for p in best.group(1).split()]


def test_the_best_so_far_is_the_highest_where_higher_is_better() -> None:
    points = [(1, 1.1, "a"), (2, 0.9, "b"), (3, 1.3, "c")]

    higher = best_line(str(progress_svg(points, lower_is_better=False, x_title="x",
                                        y_title="y", label="l")))
    lower = best_line(str(progress_svg(points, lower_is_better=True, x_title="x",
                                       y_title="y", label="l")))

    assert higher[0] == higher[1] > higher[2]  # 1.1, still 1.1 after 0.9, then 1.3 (higher)
    assert lower[0] < lower[1] == lower[2]  # 1.1, then 0.9, still 0.9 after 1.3


def test_a_long_axis_title_is_squeezed_into_the_chart() -> None:
    svg = str(progress_svg([(1, 0.9, "a")], lower_is_better=True, x_title="x", label="l",
                           y_title="tokens_per_second_at_p50 ÷ base (higher is better)"))

    assert 'textLength="192" lengthAdjust="spacingAndGlyphs">tokens_per_second' in svg


def summary(candidate: float, baseline: float, metric: str = "latency_ms") -> dict[str, Any]:
    return {"comparisons": [{"probe": "latency-bench", "variant": "", "metric": metric,
                             "case": "", "unit": "ms", "baseline_median": baseline,
                             "candidate_median": candidate, "baseline_n": 5, "candidate_n": 5,
                             "ratio": candidate / baseline if baseline else None}]}


def llm_run(goal: Goal, engineer: User, *experiments: tuple[str, dict[str, Any]]) -> AgentRun:
    """An LLM run with an experiment (status, summary) a step, in the order given."""
    run = AgentRunFactory.create(goal=goal, started_by=engineer, policy="llm",
                                 state={"hypothesis": None})
    for number, (status, measured) in enumerate(experiments, 1):
        made = ExperimentFactory.create(target=goal.target, candidate_commit="c" * 40,
                                        baseline_commit="b" * 40, status=status,
                                        summary=measured)
        run.experiments.add(made)
        Step.objects.create(run=run, number=number, summary="s", experiment=made)
    return run


@pytest.mark.django_db
def test_an_llm_run_draws_its_experiments_with_the_best_so_far(
        client: Client, engineer: User, example_goal: Goal) -> None:
    run = llm_run(example_goal, engineer, ("succeeded", summary(9.0, 10.0)),
                  ("failed", {}), ("succeeded", summary(5.0, 1.0, metric="memory_mb")),
                  ("succeeded", summary(8.0, 10.0)), ("running", {}))
    ids = list(run.experiments.order_by("pk").values_list("pk", flat=True))
    client.force_login(engineer)

    page = client.get(f"/runs/{run.pk}/").content.decode()
    svg = page[page.index("<svg"):page.index("</svg>")]

    assert len(re.findall(r'<circle class="trial"', svg)) == 2  # the running one: no point
    assert len(re.findall(r'<path class="failed"', svg)) == 2  # failed; no latency_ms
    assert f"<title>experiment {ids[0]}: 0.9</title>" in svg
    assert f"<title>experiment {ids[3]}: 0.8</title>" in svg
    assert f"<title>experiment {ids[1]}: no measurement</title>" in svg
    assert best_line(svg)[0] < best_line(svg)[1]  # 0.9, then 0.8 (lower)
    assert ">latency_ms, \N{MULTIPLICATION SIGN} base (lower is better)</text>" in svg
    assert ">experiment number (in the order asked for)</text>" in svg
    assert "Each point is an experiment's latency_ms over the base's" in page
    live = client.get(f"/runs/{run.pk}/?after=0", HTTP_HX_REQUEST="true").content.decode()
    assert 'id="run-trials" hx-swap-oob="true"' in live and "<svg" in live


@pytest.mark.django_db
def test_where_higher_is_better_the_best_so_far_is_the_highest_ratio(
        client: Client, engineer: User, example_goal: Goal) -> None:
    version = example_goal.versions.latest("number")
    version.spec["direction"] = "maximize"
    version.save()
    run = llm_run(example_goal, engineer, ("succeeded", summary(11.0, 10.0)),
                  ("succeeded", summary(10.5, 10.0)))
    client.force_login(engineer)

    page = client.get(f"/runs/{run.pk}/").content.decode()

    svg = page[page.index("<svg"):page.index("</svg>")]
    assert best_line(svg)[0] == best_line(svg)[1]  # 1.1 stays the best after 1.05
    assert ">latency_ms, \N{MULTIPLICATION SIGN} base (higher is better)</text>" in svg
    assert "(higher is better)" in page.split("</svg>")[1]


@pytest.mark.django_db
def test_an_experiment_s_ratio_is_the_medians_of_the_goal_metric_s_cells(
        engineer: User, example_goal: Goal) -> None:
    cells = summary(9.0, 10.0)["comparisons"] + summary(8.0, 10.0)["comparisons"] + [
        dict(summary(1.0, 30.0)["comparisons"][0], candidate_median=None),
        dict(summary(1.0, 1.0)["comparisons"][0], candidate_median="x", baseline_median="y"),
        dict(summary(1.0, 1.0)["comparisons"][0], probe="other-bench")]
    run = llm_run(example_goal, engineer, ("succeeded", {"comparisons": cells}),
                  ("succeeded", summary(1.0, 0.0)), ("succeeded", {"comparisons": "none"}),
                  ("failed", {}))

    ratios = [e.ratio for e in run_experiments(run)]

    # 8.5 over the median of 10, 10 and 30 (a cell's base counts without its candidate, as the
    # tuner reads it); a base of 0, a summary without cells and no summary measure nothing.
    assert ratios == [8.5 / 10.0, None, None, None]
    assert [e.unmeasured for e in run_experiments(run)] == [False, True, True, True]
