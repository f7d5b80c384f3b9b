"""The dashboard's goals with their progress, and its socket: the goals and recent runs
re-rendered while the runs it shows move, for the targets the viewer sees."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from agents.events import RUNS_GROUP, run_event
from agents.goals import goal_progress
from agents.models import AgentRun
from infraops.live import notify
from infraops.models import Experiment, Goal
from infraops.project.asgi import application
from reviews.models import Change, ReviewDecision
from tests.factories import AgentRunFactory, ChangeFactory, ExperimentFactory, UserFactory
from tests.reviews.test_queue import TIMEOUT, run_async, session_headers


def merged(goal: Goal, n: int, base: float, head: float,
           findings: list[dict[str, Any]] | None = None) -> Change:
    summary = {"comparisons": [{"probe": goal.probe, "metric": goal.metric, "unit": "ms",
                                "baseline_median": base, "candidate_median": head}]}
    experiment = ExperimentFactory.create(
        target=goal.target, candidate_commit=f"{n}" * 40, baseline_commit="a" * 40,
        status=Experiment.Status.SUCCEEDED, summary=summary,
        feedback={"findings": findings or []})
    return ChangeFactory.create(
        goal=goal, experiment=experiment, title=f"change {n}", base_commit="a" * 40,
        head_commit=f"{n}" * 40, diff="", status=Change.Status.MERGED,
        merged_at=timezone.now() + timedelta(minutes=n))


@pytest.mark.django_db
def test_a_goal_shows_how_far_its_merged_changes_moved_the_metric(
        client: Client, engineer: User, example_goal: Goal) -> None:
    Goal.objects.filter(pk=example_goal.pk).update(relative_target=0.2)
    merged(example_goal, 2, 9.0, 8.5)
    merged(example_goal, 1, 10.0, 9.0)
    AgentRunFactory.create(goal=example_goal, started_by=engineer,
                           status=AgentRun.Status.RUNNING)

    [progress] = goal_progress(None)

    assert (progress.base, progress.head, progress.merged, progress.active_runs) == (
        10.0, 8.5, 2, 1)
    assert progress.gain == pytest.approx(0.15) and progress.done == pytest.approx(0.75)
    client.force_login(engineer)
    page = client.get("/").content.decode()
    assert "15.0% better so far" in page and "(10 → 8.5 ms)" in page
    assert '<progress value="0.750" max="1"' in page and "1 active" in page
    assert f'<a href="/goals/{example_goal.pk}/">' in page


@pytest.mark.django_db
def test_a_cheat_merged_over_its_integrity_failure_is_no_progress_of_its_goal(
        client: Client, engineer: User, example_goal: Goal) -> None:
    from agents.goals import evolution

    honest = merged(example_goal, 1, 10.0, 9.0)
    # An all-zeros output, 1000x "faster": a reviewer merged it over the failing check.
    merged(example_goal, 2, 9.0, 0.009, findings=[
        {"layer": "integrity", "severity": "fail", "kind": "all-zeros",
         "title": "latency-bench candidate output is all zeros", "evidence": {}}])

    [progress] = goal_progress(None)

    assert (progress.base, progress.head, progress.merged) == (10.0, 9.0, 2)
    assert progress.gain == pytest.approx(0.1)
    assert [point.change for point in evolution(example_goal)] == [None, honest.pk]
    client.force_login(engineer)
    assert "10.0% better so far" in client.get("/").content.decode()


def approval(change: Change, reviewer: User, over: tuple[str, ...] = ()) -> ReviewDecision:
    """The approval that merged the change, over these failing checks (the override step)."""
    return ReviewDecision.objects.create(
        change=change, reviewer=reviewer, decision=ReviewDecision.Decision.APPROVE,
        overridden_checks=list(over), override_reason="the probe is flaky" if over else "",
        diff_sha256=change.diff_sha256, base_commit=change.base_commit)


@pytest.mark.django_db
def test_a_change_merged_over_failing_checks_is_marked_with_its_part_of_the_progress(
        client: Client, engineer: User, reviewer: User, example_goal: Goal) -> None:
    # issue 27: the dashboard said "34.8% better so far" with no mark
    clean = merged(example_goal, 1, 10.0, 9.0)
    over = merged(example_goal, 2, 9.0, 6.52)
    approval(clean, reviewer)
    approval(over, reviewer, over=("p99 latency stays under 12 ms",))

    [progress] = goal_progress(None)
    client.force_login(engineer)
    dashboard = " ".join(client.get("/").content.decode().split())
    goal_page = " ".join(client.get(f"/goals/{example_goal.pk}/").content.decode().split())

    assert progress.overridden == 1 and progress.gain == pytest.approx(0.348)
    assert progress.overridden_gain == pytest.approx(0.248)
    assert "34.8% better so far" in dashboard
    assert ('<strong class="overridden">24.8% better from 1 change merged over failing '
            "checks</strong>") in dashboard
    assert "34.8% better so far" in goal_page
    assert "24.8% better from 1 change merged over failing checks" in goal_page
    marked = [f'change {n.pk}</a> <span class="badge bad">merged over failing checks</span>'
              in goal_page for n in (clean, over)]
    assert marked == [False, True]


@pytest.mark.django_db
@pytest.mark.parametrize(("findings", "head"), [
    # An improvement the analysis marked uncredited: no progress.
    ([{"layer": "performance", "severity": "warn", "evidence": {"credited": False}}], 9.0),
    # An integrity failure of the baseline's side is context, not the candidate's cheat.
    ([{"layer": "integrity", "severity": "fail", "evidence": {"side": "baseline"}}], 8.0),
    # Findings that take nothing away, among which a warning of the integrity layer.
    ([{"layer": "integrity", "severity": "warn", "evidence": {}},
      {"layer": "performance", "severity": "pass", "evidence": {"credited": True}}], 8.0),
])
def test_only_the_findings_that_take_credit_away_keep_a_change_out_of_the_progress(
        example_goal: Goal, findings: list[dict[str, Any]], head: float) -> None:
    merged(example_goal, 1, 10.0, 9.0)
    merged(example_goal, 2, 9.0, 8.0, findings=findings)
    [progress] = goal_progress(None)
    assert (progress.base, progress.head, progress.merged) == (10.0, head, 2)


@pytest.mark.django_db
def test_a_goal_without_a_merged_change_says_so_and_others_targets_stay_hidden(
        client: Client, viewer: User, example_goal: Goal) -> None:
    assert goal_progress([]) == []
    [progress] = goal_progress([example_goal.target_id])
    assert progress.gain is None and progress.done is None
    client.force_login(viewer)
    assert "no merged change yet" in client.get("/").content.decode()


live = pytest.mark.django_db(transaction=True)


@live
def test_the_socket_re_renders_the_runs_as_a_run_moves_and_follows_new_runs(
        close_thread_connections: None, engineer: User, example_goal: Goal) -> None:
    running = AgentRunFactory.create(goal=example_goal, started_by=engineer,
                                     status=AgentRun.Status.RUNNING, step_count=1)
    headers = session_headers(engineer)

    def step() -> None:
        AgentRun.objects.filter(pk=running.pk).update(step_count=2)
        run_event(run_id=running.pk, kind="step", message="step 2")

    def start_another() -> AgentRun:
        run = AgentRunFactory.create(goal=example_goal, started_by=engineer,
                                     status=AgentRun.Status.RUNNING, step_count=0)
        notify(RUNS_GROUP, {"type": "runs.started"})
        return run

    def moved(run: AgentRun) -> None:
        AgentRun.objects.filter(pk=run.pk).update(step_count=7)
        run_event(run_id=run.pk, kind="step", message="step 7")

    async def scenario() -> list[str]:
        communicator = WebsocketCommunicator(application, "/ws/dashboard/", headers=headers)
        assert (await communicator.connect(timeout=TIMEOUT))[0]
        frames = [await communicator.receive_from(timeout=TIMEOUT)]  # catching up
        await sync_to_async(step)()
        frames.append(await communicator.receive_from(timeout=TIMEOUT))
        second = await sync_to_async(start_another)()
        frames.append(await communicator.receive_from(timeout=TIMEOUT))
        await sync_to_async(moved)(second)  # its own group: followed since it started
        frames.append(await communicator.receive_from(timeout=TIMEOUT))
        await communicator.disconnect()
        return frames

    frames: list[Any] = run_async(scenario)

    assert all('id="dashboard-runs" hx-swap-oob="true"' in f for f in frames)
    assert all('id="dashboard-goals" hx-swap-oob="true"' in f for f in frames)
    assert "1 of 50" in frames[0] and "2 of 50" in frames[1]
    assert frames[2].count('<tr><td data-label="Run">') == 2
    assert "7 of 50" in frames[3]


@live
def test_a_viewer_of_another_target_gets_nothing_of_its_runs(
        close_thread_connections: None, engineer: User, example_goal: Goal) -> None:
    AgentRunFactory.create(goal=example_goal, started_by=engineer,
                           status=AgentRun.Status.RUNNING, step_count=3)
    headers = session_headers(UserFactory.create(username="otto", roles=["viewer"],
                                                 member_of=[]))

    async def scenario() -> tuple[Any, ...]:
        communicator = WebsocketCommunicator(application, "/ws/dashboard/", headers=headers)
        connected = await communicator.connect(timeout=TIMEOUT)
        if not connected[0]:
            return connected
        frame = await communicator.receive_from(timeout=TIMEOUT)
        await communicator.disconnect()
        return (True, frame)

    result = run_async(scenario)

    # Either refused (no role anywhere) or shown no run of a target it is not a member of.
    assert result == (False, 4403) or ('data-label="Run"' not in result[1])
