"""A run compares its configurations on the same inputs: every experiment it queues carries
the run's seed (common random numbers), so the inputs' noise cancels in a comparison instead
of deciding it. The showcase's numerics run once submitted tf32x3 over ieee because the two
were measured on different random inputs, and ieee's error on its inputs was the larger."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from agents import services
from agents.models import AgentRun
from infraops.models import Experiment, Goal
from tests.agents.test_steering import tuner_run, tuner_step

pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")


def _next_experiment(run: AgentRun, capture: Any) -> tuple[AgentRun, Experiment]:
    for _ in range(3):  # the base configuration needs no experiment
        run = tuner_step(run, capture)
        if run.waiting_for is not None:
            return run, run.waiting_for
    raise AssertionError(f"run {run.pk} asked for no experiment")


def _fail(experiment: Experiment) -> None:
    Experiment.objects.filter(pk=experiment.pk).update(
        status=Experiment.Status.FAILED, failure_reason="the candidate crashed",
        finished_at=timezone.now())
    services.run_wake(experiment_id=experiment.pk)


def test_a_runs_experiments_share_its_seed_and_another_run_draws_its_own(
    example_goal: Goal, engineer: User, django_capture_on_commit_callbacks: Any,
) -> None:
    capture = django_capture_on_commit_callbacks
    run, first = _next_experiment(tuner_run(example_goal, engineer, capture), capture)
    _fail(first)
    run, second = _next_experiment(run, capture)

    assert second.pk != first.pk and second.candidate_commit != first.candidate_commit
    assert first.seed is not None and second.seed == first.seed == run.state["seed"]

    other, third = _next_experiment(tuner_run(example_goal, engineer, capture), capture)
    assert third.seed == other.state["seed"] != first.seed
