"""Runs survive dropped database connections (issue 28, item 1; docs/reliability.md C9): a
tuner run is driven to its end as its workers would drive it, while every backend of the test
database is terminated again and again and the connection is cut inside steps and wakes; it
ends as an undisturbed run ends, with nothing lost and nothing doubled."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.db.models import Count

from agents import services
from agents.models import AgentRun, RunEvent, Step
from agents.scripted.endpoint import OpenAIStub, completion
from infraops.dbretry import retried
from infraops.experiments import services as experiments
from infraops.models import Experiment, Goal
from tests.agents.test_llm_runs import call
from tests.dbfaults import Terminator, cutting

pytestmark = [pytest.mark.django_db(transaction=True),
              pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")]

TERMINATIONS = 12  # 1.5 s apart: each transaction of a step or an experiment has time to
#                   complete between two, as after any one blip


@pytest.fixture
def terminator() -> Iterator[Terminator]:
    thread = Terminator(times=TERMINATIONS, every=1.5)
    yield thread
    thread.stop.set()
    if thread.is_alive():
        thread.join(timeout=60)


def _read(run_id: int) -> AgentRun:
    """The test's own reads meet the terminations too: read as the product does."""
    return retried(lambda: AgentRun.objects.get(pk=run_id), what="test read")


def _drive(run_id: int) -> AgentRun:
    """Steps and experiments in this process, one task at a time, as the workers run them."""
    for _ in range(60):
        run = _read(run_id)
        if run.is_finished or run.status == AgentRun.Status.PAUSED:
            return run
        services.run_step(run_id=run_id, number=run.step_count)
        waiting = _read(run_id).waiting_for_id
        if waiting is not None:
            experiments.experiment_execute(experiment_id=waiting, worker="faults:1")
            services.run_wake(experiment_id=waiting)
    raise AssertionError(f"run {run_id} did not end in 60 steps")


def test_a_tuner_run_survives_its_connections_being_terminated_again_and_again(
    example_goal: Goal, engineer: User, terminator: Terminator,
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    # The test takes each step and experiment itself: nothing goes to the broker.
    monkeypatch.setattr(services, "_enqueue_step", lambda run, countdown=None: None)
    monkeypatch.setattr(experiments, "_send_after_commit", lambda pk, queue: None)
    record, cut_records = cutting(services._record, 2)
    wake, cut_wakes = cutting(services._wake, 2)
    monkeypatch.setattr(services, "_record", record)
    monkeypatch.setattr(services, "_wake", wake)
    example_goal.boundary.max_experiments = 3  # three trials, then the choice
    example_goal.boundary.save()
    run = services.run_start(goal=example_goal, user=engineer)
    terminator.start()

    run = _drive(run.pk)
    terminator.stop.set()
    terminator.join(timeout=60)
    connection.close()

    assert terminator.error is None and terminator.done >= 1
    assert (cut_records, cut_wakes) == ([1, 1], [1, 1])
    assert run.status in (AgentRun.Status.SUCCEEDED, AgentRun.Status.FINISHED), run.stop_reason
    assert [r for r in caplog.records if r.name == "infraops.dbretry" and "step" in r.message]
    # Nothing lost: every experiment measured, every trial read.
    ran = Experiment.objects.filter(runs=run)
    assert not ran.filter(lost=True).exists()
    assert set(ran.values_list("status", flat=True)) == {Experiment.Status.SUCCEEDED}
    trials = run.state["trials"]
    assert all(t.get("objective") is not None for t in trials)
    # Nothing doubled: one experiment per trial that needed one, counted once, steps and
    # events numbered without a gap, each step announced once.
    assert sorted(ran.values_list("pk", flat=True)) == sorted(
        t["experiment"] for t in trials if t.get("experiment"))
    assert run.experiment_count == ran.count()
    assert list(Step.objects.filter(run=run).values_list("number", flat=True)) == list(
        range(1, run.step_count + 1))
    seqs = list(RunEvent.objects.filter(run=run).values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1))
    announced = RunEvent.objects.filter(run=run, kind="step").values("message").annotate(
        n=Count("id"))
    assert all(row["n"] == 1 for row in announced)
    assert run.changes.count() == (1 if run.status == AgentRun.Status.SUCCEEDED else 0)


def test_a_model_reply_whose_step_lost_its_connection_counts_its_tokens_once(
    stub: OpenAIStub, llm_goal: Callable[..., Goal], engineer: User,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The step is taken again with a new reply (the tools may have run already: the model
    reads the worktree anew rather than have its calls replayed); the lost reply still cost
    its tokens, counted once."""
    monkeypatch.setattr(services, "_enqueue_step", lambda run, countdown=None: None)
    record, cuts = cutting(services._record, 1)
    monkeypatch.setattr(services, "_record", record)
    for _ in range(2):
        stub.push(completion(tool_calls=[call("list_files", glob="*")], usage=(700, 30)))
    run = services.run_start(goal=llm_goal(), user=engineer)

    services.run_step(run_id=run.pk, number=0)

    run.refresh_from_db()
    assert cuts == [1] and not stub.remaining
    assert run.step_count == 1 and run.tokens_used == 2 * 730
    assert run.events.filter(message__startswith="The database connection dropped while step "
                                                  "1 was recorded").count() == 1
