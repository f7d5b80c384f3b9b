"""agents.services without workers: start, step guards, pause, resume, cancel, the event log.

Celery's tasks are sent to a real broker: kombu's in-process memory transport, so that the
test reads back exactly what a worker would receive without sharing a Redis queue with it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery, current_app
from django.contrib.auth.models import User

from agents import services
from agents.events import run_event
from agents.models import AgentRun, RunEvent, Step
from infraops.errors import DomainError
from infraops.models import AuditEntry, Goal, Target
from infraops.services.goals import goal_snapshot
from infraops.services.targets import target_register
from tests.conftest import make_origin, members_of_new_target
from tests.factories import GoalFactory

Sent = Callable[[], list[tuple[str, list[Any]]]]

pytestmark = [pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")]


@pytest.fixture
def sent_tasks() -> Iterator[Sent]:
    """Make a Celery app on the memory transport current; sent_tasks() drains the 'agent'
    queue and returns (task name, args) of each message."""
    previous = current_app._get_current_object()
    app = Celery("infraops-tests", set_as_current=True)
    app.config_from_object("django.conf:settings", namespace="CELERY")
    app.conf.update(broker_url="memory://")

    def drain() -> list[tuple[str, list[Any]]]:
        messages = []
        with app.connection_for_read() as connection:
            queue = connection.SimpleQueue("agent")
            while True:
                try:
                    message = queue.get(block=False)
                except queue.Empty:
                    break
                messages.append((message.headers["task"], message.decode()[0]))
                message.ack()
            queue.close()
        return messages

    try:
        yield drain
    finally:
        drain()
        previous.set_current()


def statuses(run: AgentRun) -> list[tuple[int, str, str]]:
    return [(e.seq, e.kind, e.data.get("status", ""))
            for e in RunEvent.objects.filter(run=run).order_by("seq")]


@pytest.fixture
def run(example_goal: Goal, engineer: User) -> AgentRun:
    return services.run_start(goal=example_goal, user=engineer)


def test_a_viewer_cannot_start_a_run(example_goal: Goal, viewer: User) -> None:
    with pytest.raises(DomainError, match="Only an engineer can start a run"):
        services.run_start(goal=example_goal, user=viewer)

    assert not AgentRun.objects.exists()


def test_the_llm_policy_without_an_endpoint_is_refused_with_the_reason(
    example_goal: Goal, engineer: User, settings: Any
) -> None:
    settings.OPENAI_BASE_URL = ""
    Goal.objects.filter(pk=example_goal.pk).update(policy=Goal.Policy.LLM)
    example_goal.refresh_from_db()

    with pytest.raises(DomainError, match="LLM policy needs OPENAI_BASE_URL and a model"):
        services.run_start(goal=example_goal, user=engineer)

    assert not AgentRun.objects.exists()


def test_a_run_waits_for_its_targets_fetch_and_never_fetches_in_the_request(
    example_goal: Goal, engineer: User
) -> None:
    """Issue 28: a form runs no git; a target whose fetch failed says why instead."""
    Target.objects.filter(pk=example_goal.target_id).update(
        fetch_status=Target.Fetch.FAILED, fetch_error="The repository cannot be read.")
    example_goal.refresh_from_db()

    with pytest.raises(DomainError, match=re.escape(
            "tiny-serving's repository could not be fetched: The repository cannot be read. "
            "Fix the target")):
        services.run_start(goal=example_goal, user=engineer)

    assert not AgentRun.objects.exists()


def test_a_target_without_knobs_cannot_start_a_tuner_run(
    engineer: User, example_source: Path, tmp_path: Path
) -> None:
    manifest = example_source / "infraops.toml"
    text = manifest.read_text()
    manifest.write_text(text[: text.index("[[knob]]")])
    target = members_of_new_target(target_register(
        name="no-knobs", base_branch="main",
        repo_url=str(make_origin(tmp_path, example_source, "bare.git"))))
    goal = GoalFactory.create(target=target, name="g", probe="latency-bench",
                              metric="latency_ms")

    with pytest.raises(DomainError, match="declares no \\[\\[knob\\]\\]"):
        services.run_start(goal=goal, user=engineer)

    assert not AgentRun.objects.exists()


def test_an_engineer_starts_a_run_pinned_to_the_goals_version(
    example_goal: Goal, engineer: User, django_capture_on_commit_callbacks: Any,
    sent_tasks: Sent
) -> None:
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        run = services.run_start(goal=example_goal, user=engineer)

    assert run.status == AgentRun.Status.RUNNING
    assert run.goal_version.goal_id == example_goal.pk
    assert run.goal_version.number == example_goal.current_version == 1
    assert run.base_commit == example_goal.target.manifest_commit
    assert run.manifest_sha256 == example_goal.target.manifest_sha256
    assert run.started_by == engineer
    [event] = RunEvent.objects.filter(run=run)
    assert (event.seq, event.kind) == (1, "status")
    assert "Run started by erin on goal 'latency' v1" in event.message
    assert AuditEntry.objects.filter(action="run.start", object_id=str(run.pk)).count() == 1
    # Nothing is sent before the commit; after it, exactly one step-0 task.
    assert sent_tasks() == []
    for callback in callbacks:
        callback()
    assert sent_tasks() == [("agents.tasks.agent_step", [run.pk, 0])]


def test_editing_the_goal_later_does_not_change_a_started_run(run: AgentRun, example_goal: Goal,
                                                              engineer: User) -> None:
    example_goal.direction = Goal.Direction.MAXIMIZE
    example_goal.save()
    newer = goal_snapshot(goal=example_goal, user=engineer)

    run.refresh_from_db()
    assert newer.number == 2
    assert run.goal_version.number == 1
    assert run.goal_version.spec["direction"] == "minimize"
    assert newer.spec["direction"] == "maximize"


def test_pause_resume_and_cancel_move_the_run_and_log_each_move(
    run: AgentRun, engineer: User, django_capture_on_commit_callbacks: Any, sent_tasks: Sent
) -> None:
    paused = services.run_pause(run=run, user=engineer)
    assert paused.status == AgentRun.Status.PAUSED

    with django_capture_on_commit_callbacks(execute=True):
        resumed = services.run_resume(run=run, user=engineer)
    assert resumed.status == AgentRun.Status.RUNNING
    assert sent_tasks() == [("agents.tasks.agent_step", [run.pk, 0])]

    cancelled = services.run_cancel(run=run, user=engineer)
    assert cancelled.status == AgentRun.Status.CANCELLED
    assert cancelled.finished_at is not None
    assert cancelled.stop_reason == "cancelled by erin"

    assert statuses(run) == [(1, "status", ""), (2, "status", "paused"),
                             (3, "status", "running"), (4, "status", "cancelled")]
    assert list(AuditEntry.objects.filter(object_id=str(run.pk), object_type="agents.agentrun")
                .order_by("pk").values_list("action", flat=True)) == [
        "run.start", "run.paused", "run.resumed", "run.cancel"]


def test_pausing_twice_is_refused_and_logs_nothing(run: AgentRun, engineer: User) -> None:
    services.run_pause(run=run, user=engineer)

    with pytest.raises(DomainError, match="The run is paused, so it cannot be paused"):
        services.run_pause(run=run, user=engineer)

    assert [seq for seq, _, _ in statuses(run)] == [1, 2]


@pytest.mark.parametrize(("control", "message"), [
    (services.run_resume, "The run is running, so it cannot be resumed"),
    (services.run_pause, "The run is cancelled, so it cannot be paused"),
    (services.run_cancel, "The run already ended \\(cancelled\\)"),
])
def test_controls_that_do_not_fit_the_status_are_refused(
    run: AgentRun, engineer: User, control: Callable[..., AgentRun], message: str
) -> None:
    if control is not services.run_resume:
        services.run_cancel(run=run, user=engineer)
    events_before = RunEvent.objects.filter(run=run).count()

    with pytest.raises(DomainError, match=message):
        control(run=run, user=engineer)

    assert RunEvent.objects.filter(run=run).count() == events_before


@pytest.mark.parametrize("control", [services.run_pause, services.run_resume,
                                     services.run_cancel])
def test_a_viewer_cannot_control_a_run(run: AgentRun, viewer: User,
                                       control: Callable[..., AgentRun]) -> None:
    with pytest.raises(DomainError, match="Only an engineer"):
        control(run=run, user=viewer)

    run.refresh_from_db()
    assert run.status == AgentRun.Status.RUNNING


@pytest.mark.parametrize("number", [1, 5])
def test_a_step_with_the_wrong_number_does_nothing(
    run: AgentRun, number: int, django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        result = services.run_step(run_id=run.pk, number=number)

    assert result is None
    run.refresh_from_db()
    assert run.step_count == 0
    assert not Step.objects.filter(run=run).exists()
    assert RunEvent.objects.filter(run=run).count() == 1
    assert callbacks == []


def test_a_step_of_a_paused_or_missing_run_does_nothing(run: AgentRun, engineer: User) -> None:
    services.run_pause(run=run, user=engineer)

    assert services.run_step(run_id=run.pk, number=0) is None
    assert services.run_step(run_id=run.pk + 1000, number=0) is None
    assert not Step.objects.exists()


def test_the_same_step_delivered_twice_is_taken_once(run: AgentRun) -> None:
    taken = services.run_step(run_id=run.pk, number=0)
    again = services.run_step(run_id=run.pk, number=0)

    assert taken is not None
    assert again is None
    run.refresh_from_db()
    assert run.step_count == 1
    [step] = Step.objects.filter(run=run)
    assert step.number == 1
    assert step.tool in ("run_experiment", "tuner.ask")
    assert set(step.arguments["params"]) == {"batch_size"}
    assert RunEvent.objects.filter(run=run, kind="step").count() == 1


def test_event_numbers_are_consecutive_per_run(run: AgentRun, example_goal: Goal,
                                               engineer: User) -> None:
    other = services.run_start(goal=example_goal, user=engineer)
    for number in range(5):
        run_event(run_id=run.pk, kind="step", message=f"step {number}")
    run_event(run_id=other.pk, kind="step", message="other")

    assert list(RunEvent.objects.filter(run=run).order_by("pk")
                .values_list("seq", flat=True)) == [1, 2, 3, 4, 5, 6]
    assert list(RunEvent.objects.filter(run=other).values_list("seq", flat=True)) == [1, 2]
    run.refresh_from_db()
    assert run.event_seq == 6
