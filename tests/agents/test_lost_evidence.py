"""A run tells experiments lost to infrastructure apart from those that measured (issue 28,
item 1): a configuration whose experiment was lost is measured again, the tuner never chooses
on evidence it lost (it pauses and says how much was lost), and the run page counts them."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from agents import services
from agents.models import AgentRun
from agents.policies.shared import experiment_text
from infraops.experiments.services import experiment_execute
from infraops.models import Experiment, Goal
from tests.agents.test_steering import tuner_run, tuner_step

pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")

DROPPED = ("unexpected error OperationalError: consuming input failed: terminating connection "
           "due to administrator command (at infraops/experiments/results.py:214 in flush)")


def _lose(experiment_id: int) -> None:
    """The experiment ends as a dropped database connection ended it before the retries."""
    Experiment.objects.filter(pk=experiment_id).update(
        status=Experiment.Status.FAILED, failure_reason=DROPPED, lost=True,
        finished_at=timezone.now())
    services.run_wake(experiment_id=experiment_id)


def _to_experiment(run: AgentRun, capture: Any) -> tuple[AgentRun, Experiment]:
    """Step until the run waits for an experiment (the base configuration needs none)."""
    for _ in range(3):
        run = tuner_step(run, capture)
        if run.waiting_for is not None:
            return run, run.waiting_for
    raise AssertionError(f"run {run.pk} asked for no experiment")


def test_a_lost_configuration_is_measured_again_and_the_tuner_never_chooses_on_lost_evidence(
    example_goal: Goal, engineer: User, client: Client,
    django_capture_on_commit_callbacks: Any,
) -> None:
    capture = django_capture_on_commit_callbacks
    run, measured = _to_experiment(tuner_run(example_goal, engineer, capture), capture)
    experiment_execute(experiment_id=measured.pk, worker="test:1")
    services.run_wake(experiment_id=measured.pk)
    # Reads the measurement, then tries the next configuration.
    run, first = _to_experiment(run, capture)

    _lose(first.pk)
    run = tuner_step(run, capture)
    assert run.steps.order_by("number").values_list("verdict", flat=True).last() == (
        "lost to infrastructure")
    run, again = _to_experiment(run, capture)
    assert again.pk != first.pk and again.candidate_commit == first.candidate_commit
    _lose(again.pk)
    services.run_message_add(run=run, user=engineer, text="stop")  # choose after this read
    run = tuner_step(run, capture)
    run = tuner_step(run, capture)

    # Before: the tuner chose from the one measurement and submitted (or said nothing beat
    # the base), as if the lost configuration had been measured.
    assert run.status == AgentRun.Status.PAUSED
    assert run.stop_reason == (
        f"1 of {len(run.state['trials'])} configurations lost their experiments to "
        f"infrastructure (experiments {again.pk}; "
        f"{sum(1 for t in run.state['trials'] if t.get('experiment') and t.get('objective'))} "
        "measured): nothing is submitted on evidence that was lost. Resume the run to measure "
        "them again.")
    assert not run.changes.exists()
    client.force_login(engineer)
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert "lost to infrastructure" in page and ", 2 lost to infrastructure" in page
    assert "Lost to infrastructure: no evidence either way" in page

    services.run_resume(run=run, user=engineer)
    run, third = _to_experiment(run, capture)
    assert third.candidate_commit == first.candidate_commit
    assert third.pk not in (first.pk, again.pk)


def test_the_llm_reads_a_lost_experiment_as_no_evidence_either_way(
    example_goal: Goal,
) -> None:
    experiment = Experiment.objects.create(
        target=example_goal.target, candidate_commit="b" * 40, baseline_commit="a" * 40,
        status=Experiment.Status.FAILED, failure_reason=DROPPED, lost=True)

    assert experiment_text(experiment) == (
        "Failure: lost to infrastructure, no evidence either way (run the experiment again): "
        + DROPPED)
