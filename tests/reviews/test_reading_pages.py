"""The five pages a reviewer reads while runs stream (dashboard, run, experiment, queue,
change) under load (issue 28): each reads a fixed number of queries however many rows it shows,
and what never changes is computed once per process, not on every read.

bench/load.py measures what they cost under 30 clients; these tests hold the causes: an N+1
that creeps back, charts drawn again on every read, git run again for commits that cannot
change, a gate written back though it did not move."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agents.models import AgentRun, RunEvent, Step
from infraops import gitops
from infraops.feedback import charts
from infraops.models import Experiment, ExperimentLog, Goal, ProbeExecution, Target
from reviews.models import Change, ReviewComment
from reviews.services import facts
from tests.factories import AgentRunFactory, ExperimentFactory

pytestmark = pytest.mark.django_db

FINDING = {"severity": "pass", "layer": "performance", "kind": "metric",
           "title": "latency-bench latency_ms improved", "detail": "-10%", "evidence": {}}
FEEDBACK: dict[str, Any] = {
    "verdict": "improved", "counts": {"pass": 1, "fail": 0, "warn": 0, "info": 0},
    "findings": [FINDING],
    "distributions": [{"label": "latency-bench latency_ms", "unit": "ms",
                       "baseline": [10.0, 10.2, 9.9], "candidate": [9.0, 9.1, 8.9]}]}


def finished(target: Target, feedback: dict[str, Any] = FEEDBACK) -> Experiment:
    return ExperimentFactory.create(
        target=target, status=Experiment.Status.SUCCEEDED, probes=["latency-bench"],
        attempts=1, finished_at=timezone.now(), feedback=feedback,
        summary={"comparisons": [{"probe": "latency-bench", "metric": "latency_ms",
                                  "unit": "ms", "baseline_median": 10.0,
                                  "candidate_median": 9.0, "ratio": 0.9,
                                  "baseline_n": 3, "candidate_n": 3}]})


def grow(experiment: Experiment, run: AgentRun, change: Change, user: User, size: int) -> None:
    """`size` more of every kind of row the pages list."""
    if not size:
        return
    first = experiment.logs.count() + 1
    ExperimentLog.objects.bulk_create(
        ExperimentLog(experiment=experiment, seq=n, execution_label="latency-bench #1",
                      stream="stdout", text=f"line {n}") for n in range(first, first + size))
    Experiment.objects.filter(pk=experiment.pk).update(log_seq=first + size - 1)
    ProbeExecution.objects.bulk_create(
        ProbeExecution(experiment=experiment, attempt=1, probe="latency-bench", side=side,
                       repeat_index=n, seed=n, exit_code=0, reason="ok", wall_seconds=1.0)
        for side in ("baseline", "candidate") for n in range(first, first + size))
    steps = run.steps.count()
    Step.objects.bulk_create(Step(run=run, number=steps + n, summary=f"step {n}",
                                  experiment=experiment) for n in range(1, size + 1))
    run.refresh_from_db()
    events = run.event_seq
    RunEvent.objects.bulk_create(RunEvent(run=run, seq=events + n, kind="step",
                                          message=f"Step {n}.") for n in range(1, size + 1))
    AgentRun.objects.filter(pk=run.pk).update(event_seq=events + size)
    for _ in range(size):
        ReviewComment.objects.create(change=change, author=user, path="config/serving.toml",
                                     line=2, text="why?", diff_sha256=change.diff_sha256)
    # More changes in the queue, each of its own goal-less run.
    for n in range(size):
        Change.objects.create(target=change.target, title=f"change {n}", hypothesis="h",
                              base_commit=change.base_commit, head_commit=change.head_commit,
                              diff=change.diff, diff_sha256=change.diff_sha256,
                              author_label=f"run {n}")


# The queries each page reads (a signed-in engineer), whatever it shows: an N+1 that creeps
# back fails here. Measured on issue 28's branch; lower is welcome, higher needs a reason.
# The change page's twelfth: who granted the deciders their rights, and when (issue 27's
# separation of duties), one read however many decisions it shows.
MOST_QUERIES = {"dashboard": 10, "run": 11, "experiment": 10, "queue": 6, "change": 12}


@pytest.mark.parametrize("page", sorted(MOST_QUERIES))
def test_each_reading_page_reads_a_fixed_number_of_queries_however_many_rows_it_shows(
        page: str, client: Client, engineer: User, example_goal: Goal, config_change: Change,
        django_assert_max_num_queries: Any) -> None:
    experiment = finished(example_goal.target)
    Change.objects.filter(pk=config_change.pk).update(experiment=experiment)
    run = AgentRunFactory.create(goal=example_goal, started_by=engineer,
                                 status=AgentRun.Status.PAUSED)
    path = {"dashboard": "/", "run": f"/runs/{run.pk}/",
            "experiment": f"/experiments/{experiment.pk}/", "queue": "/reviews/?scope=all",
            "change": f"/reviews/changes/{config_change.pk}/"}[page]
    client.force_login(engineer)
    grow(experiment, run, config_change, engineer, 2)
    for more in (0, 0, 20):  # a first read (it renders the rows), the same again, 20 rows more
        grow(experiment, run, config_change, engineer, more)
        with django_assert_max_num_queries(MOST_QUERIES[page]):
            assert client.get(path).status_code == 200


def test_a_finished_experiments_charts_are_drawn_once_for_its_page_and_its_changes(
        client: Client, viewer: User, example_target: Target, config_change: Change,
        monkeypatch: pytest.MonkeyPatch) -> None:
    experiment = finished(example_target)
    Change.objects.filter(pk=config_change.pk).update(experiment=experiment)
    drawn: list[Any] = []
    draw = charts.ab_distributions

    def counted(groups: Any) -> dict[str, Any]:
        drawn.append(groups)
        return draw(groups)

    monkeypatch.setattr(charts, "ab_distributions", counted)
    client.force_login(viewer)

    pages = [client.get(f"/experiments/{experiment.pk}/").content.decode() for _ in range(3)]
    pages += [client.get(f"/reviews/changes/{config_change.pk}/").content.decode()
              for _ in range(2)]

    assert len(drawn) == 1
    assert all('id="chart-ab"' in page and 'id="chart-ab-figure"' in page for page in pages)


def test_an_experiment_finished_again_by_another_attempt_shows_its_new_record(
        client: Client, viewer: User, example_target: Target) -> None:
    experiment = finished(example_target)
    client.force_login(viewer)
    first = client.get(f"/experiments/{experiment.pk}/").content.decode()
    later = FEEDBACK | {"findings": [FINDING | {"title": "second attempt"}],
                        "distributions": []}
    Experiment.objects.filter(pk=experiment.pk).update(
        attempts=2, finished_at=timezone.now() + timedelta(seconds=1), feedback=later)

    second = client.get(f"/experiments/{experiment.pk}/").content.decode()

    assert "latency-bench latency_ms improved" in first and 'id="chart-ab"' in first
    assert "second attempt" in second and "latency-bench latency_ms improved" not in second
    assert 'id="chart-ab"' not in second


def test_a_running_experiments_page_shows_each_new_output_row(
        client: Client, viewer: User, example_target: Target) -> None:
    experiment = ExperimentFactory.create(target=example_target, status="running")
    client.force_login(viewer)
    for seq in (1, 2):
        ExperimentLog.objects.create(experiment=experiment, seq=seq, stream="stdout",
                                     text=f"output <{seq}>")
        page = client.get(f"/experiments/{experiment.pk}/").content.decode()
        assert f"output &lt;{seq}&gt;" in page
    assert page.count('data-seq="') == 2


def test_an_open_changes_page_runs_git_once_for_its_commits_and_writes_no_unmoved_gate(
        client: Client, viewer: User, config_change: Change,
        monkeypatch: pytest.MonkeyPatch) -> None:
    facts._changed_paths_between_commits.cache_clear()
    listed: list[Any] = []
    real = gitops.changed_paths

    def counted(*args: Any) -> list[str]:
        listed.append(args)
        return real(*args)

    monkeypatch.setattr(gitops, "changed_paths", counted)
    client.force_login(viewer)
    assert client.get(f"/reviews/changes/{config_change.pk}/").status_code == 200

    with CaptureQueriesContext(connection) as queries:
        again = client.get(f"/reviews/changes/{config_change.pk}/")

    assert again.status_code == 200 and len(listed) == 1
    writes = [q["sql"] for q in queries.captured_queries
              if q["sql"].startswith("UPDATE") and "reviews_change" in q["sql"]]
    assert writes == []
