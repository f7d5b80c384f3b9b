"""Runs never stall silently: a step that raises pauses its run with the reason, and the
reaper re-queues the next step of a running run whose step message was lost."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib.auth.models import User
from django.utils import timezone

from agents import tasks
from agents.models import AgentRun, RunEvent
from agents.services import run_start, runs_reap
from infraops.models import Goal
from tests.factories import ExperimentFactory


def started(goal: Goal, user: User, capture: Any) -> AgentRun:
    with capture(execute=False):
        return run_start(goal=goal, user=user)


def test_a_step_that_raises_unexpectedly_pauses_the_run_with_the_reason(
    example_goal: Goal, engineer: User, django_capture_on_commit_callbacks: Any,
) -> None:
    run = started(example_goal, engineer, django_capture_on_commit_callbacks)
    AgentRun.objects.filter(pk=run.pk).update(state={"trials": "not a list"})

    with django_capture_on_commit_callbacks(execute=False):
        tasks.agent_step(run.pk, 0)  # the task body, as the worker runs it

    run.refresh_from_db()
    assert run.status == AgentRun.Status.PAUSED
    assert run.stop_reason.startswith("a step failed: ")
    assert run.events.filter(message__startswith="Run paused: a step failed").exists()


def test_the_reaper_requeues_only_running_runs_that_stalled_without_waiting(
    example_goal: Goal, engineer: User, django_capture_on_commit_callbacks: Any,
) -> None:
    stalled = started(example_goal, engineer, django_capture_on_commit_callbacks)
    fresh = started(example_goal, engineer, django_capture_on_commit_callbacks)
    waiting = started(example_goal, engineer, django_capture_on_commit_callbacks)
    long_ago = timezone.now() - timedelta(minutes=30)
    RunEvent.objects.filter(run__in=[stalled, waiting]).update(created_at=long_ago)
    experiment = ExperimentFactory.create(target=waiting.target, candidate_commit="a" * 40,
                                          baseline_commit="b" * 40)
    AgentRun.objects.filter(pk=waiting.pk).update(waiting_for=experiment)

    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        requeued = runs_reap()

    assert requeued == [stalled.pk]
    assert len(callbacks) == 1
    assert fresh.pk not in requeued


def test_the_reaper_wakes_a_run_whose_experiment_finished_but_whose_wake_was_lost(
    example_goal: Goal, engineer: User, django_capture_on_commit_callbacks: Any,
) -> None:
    """Issue 28: the wake rides on the experiment's end; a dropped connection can lose it."""
    run = started(example_goal, engineer, django_capture_on_commit_callbacks)
    experiment = ExperimentFactory.create(target=run.target, candidate_commit="a" * 40,
                                          baseline_commit="b" * 40, status="succeeded")
    AgentRun.objects.filter(pk=run.pk).update(waiting_for=experiment)

    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        requeued = runs_reap()

    run.refresh_from_db()
    assert requeued == [run.pk]
    assert [c for c in callbacks if c.__qualname__.startswith("_enqueue_step")]  # its next step
    assert run.waiting_for_id is None
    assert run.events.filter(message=f"Experiment {experiment.pk} succeeded.").count() == 1
