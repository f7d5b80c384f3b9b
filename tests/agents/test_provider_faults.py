"""A failing model endpoint does not end a run for good: 429s wait as asked, 5xx, timeouts and
refused connections are retried with backoff, all for INFRAOPS_LLM_RETRY_SECONDS from the
first of them, then the run pauses with the reason and Resume retries; only what no retry
fixes (a 401) fails it. Each wait is an event on the run page. A real local
OpenAI-compatible server plays the endpoint."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User

from agents.models import AgentRun
from agents.scripted.endpoint import (
    OpenAIStub,
    StubReply,
    completion,
    rate_limited,
    server_error,
)
from agents.services import run_resume, run_start
from infraops.models import Goal
from tests.agents.test_llm_runs import call, step


def steps_queued(callbacks: list[Callable[[], Any]]) -> int:
    """How many of the on-commit callbacks queue an agent step (the others notify pages)."""
    return sum("_enqueue_step" in callback.__qualname__ for callback in callbacks)


def waits(run: AgentRun) -> list[dict[str, Any]]:
    return [e.data for e in run.events.filter(kind="wait").order_by("seq")]


def test_three_500s_in_a_row_wait_and_retry_instead_of_failing_the_run(
    stub: OpenAIStub, llm_goal: Callable[..., Goal], engineer: User,
    django_capture_on_commit_callbacks: Any,
) -> None:
    goal = llm_goal()
    for _ in range(3):
        stub.push(server_error(500))
    stub.push(completion(tool_calls=[call("list_files", glob="*.toml")]))
    with django_capture_on_commit_callbacks(execute=False) as queued:
        run = run_start(goal=goal, user=engineer)
        run = step(run)
    first_failure = run.provider_failing_since

    assert run.status == AgentRun.Status.RUNNING
    assert run.step_count == 0 and first_failure is not None
    assert len(stub.requests) == 1  # one request per step: no retry sleeps in the worker
    assert steps_queued(queued) == 2  # the first step, then the same step re-scheduled after commit

    with django_capture_on_commit_callbacks(execute=False) as queued:
        run = step(run)
        run = step(run)
    seen = waits(run)
    # Each failure re-schedules the step with a longer backoff; the window keeps its start.
    assert [w["attempt"] for w in seen] == [1, 2, 3]
    assert [w["retry_in"] for w in seen] == [2.0, 4.0, 8.0]
    assert all("500" in w["reason"] for w in seen)
    assert len(stub.requests) == 3 and steps_queued(queued) == 2
    assert run.provider_failing_since == first_failure

    with django_capture_on_commit_callbacks(execute=False):
        run = step(run)

    assert run.step_count == 1 and run.status == AgentRun.Status.RUNNING
    assert run.provider_failing_since is None  # an answer clears the failing window


def test_a_refused_connection_past_the_retry_window_pauses_and_resume_completes(
    stub: OpenAIStub, llm_goal: Callable[..., Goal], engineer: User,
    django_capture_on_commit_callbacks: Any, settings: Any,
) -> None:
    goal = llm_goal()
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    settings.OPENAI_BASE_URL = f"http://127.0.0.1:{port}/v1"  # nothing listens there
    with django_capture_on_commit_callbacks(execute=False):
        run = run_start(goal=goal, user=engineer)
        run = step(run)
        assert run.status == AgentRun.Status.RUNNING
        assert "could not be reached" in waits(run)[0]["reason"]

        settings.LLM_RETRY_SECONDS = 0
        run = step(run)

    assert run.status == AgentRun.Status.PAUSED
    assert "the model endpoint has failed for" in run.stop_reason
    assert "could not be reached" in run.stop_reason and "Resume retries" in run.stop_reason

    settings.OPENAI_BASE_URL = stub.base_url
    settings.LLM_RETRY_SECONDS = 300
    stub.push(completion(tool_calls=[call("finish", summary="the endpoint is back")]))
    with django_capture_on_commit_callbacks(execute=False):
        run = run_resume(run=run, user=engineer)
        run = step(run)

    assert run.status == AgentRun.Status.FINISHED
    assert "the endpoint is back" in run.stop_reason


def test_a_long_rate_limit_re_schedules_the_step_as_the_server_asks(
    stub: OpenAIStub, llm_goal: Callable[..., Goal], engineer: User,
    django_capture_on_commit_callbacks: Any,
) -> None:
    goal = llm_goal()
    stub.push(rate_limited(120))
    with django_capture_on_commit_callbacks(execute=False):
        run = run_start(goal=goal, user=engineer)
        run = step(run)

    assert run.status == AgentRun.Status.RUNNING and run.step_count == 0
    [wait] = waits(run)
    assert wait["retry_in"] == 120
    assert run.provider_failing_since is not None  # the retry window starts at the first 429
    assert "provider_attempts" not in run.state  # a rate limit is not a fault to back off


def test_a_short_rate_limit_re_schedules_the_step_instead_of_sleeping_in_the_worker(
    stub: OpenAIStub, llm_goal: Callable[..., Goal], engineer: User,
    django_capture_on_commit_callbacks: Any,
) -> None:
    goal = llm_goal()
    stub.push(rate_limited(0.2))
    stub.push(completion(tool_calls=[call("list_files", glob="*.toml")]))
    with django_capture_on_commit_callbacks(execute=False) as queued:
        run = run_start(goal=goal, user=engineer)
        run = step(run)

    assert run.step_count == 0 and len(stub.requests) == 1
    assert steps_queued(queued) == 2  # the step again, after the wait the server asked for
    [wait] = waits(run)
    assert wait["retry_in"] == 0.2 and "429" in wait["reason"]

    with django_capture_on_commit_callbacks(execute=False):
        run = step(run)

    assert run.step_count == 1
    assert run.provider_failing_since is None  # an answer ends the retry window


def test_a_storm_of_429s_backs_off_and_logs_only_at_powers_of_two_until_the_model_answers(
    stub: OpenAIStub, llm_goal: Callable[..., Goal], engineer: User,
    django_capture_on_commit_callbacks: Any,
) -> None:
    """A server that answers "retry in 0 s" twenty times: the step is asked once per task (no
    sleep in a worker), the waits grow from the second 429 as a fault's backoff would, the
    run's log gets the 1st, 2nd, 4th, 8th and 16th, and the first answer ends the storm."""
    goal = llm_goal()
    for _ in range(20):
        stub.push(rate_limited(0))
    stub.push(completion(tool_calls=[call("list_files", glob="*.toml")]))
    countdowns: list[Any] = []
    with django_capture_on_commit_callbacks(execute=False):
        run = run_start(goal=goal, user=engineer)
        run = step(run)
    first_429 = run.provider_failing_since
    assert first_429 is not None  # the retry window starts at the first 429
    for _ in range(19):
        with django_capture_on_commit_callbacks(execute=False) as queued:
            run = step(run)
        countdowns += [c for c in queued if "_enqueue_step" in c.__qualname__]
        assert run.status == AgentRun.Status.RUNNING and run.step_count == 0

    seen = waits(run)
    messages = [e.message for e in run.events.filter(kind="wait").order_by("seq")]
    assert messages == ["Rate limited: the model asked to retry in 0 s."] + [
        f"Rate limited ({n} rate limits in a row): retrying in {wait} s (the model asked for "
        "0 s)." for n, wait in ((2, 2), (4, 8), (8, 60), (16, 60))]  # capped at a minute
    assert [w["retry_in"] for w in seen] == [0, 2.0, 8.0, 60.0, 60.0]
    assert all("429" in w["reason"] and w["attempt"] == 0 for w in seen)  # no fault's attempt
    assert len(countdowns) == 19 and len(stub.requests) == 20  # one request per step task
    assert run.provider_failing_since == first_429  # the storm's window keeps its start
    assert run.state["rate_limited_in_row"] == 20

    with django_capture_on_commit_callbacks(execute=False):
        run = step(run)
    assert run.step_count == 1 and "rate_limited_in_row" not in run.state


@pytest.mark.parametrize("retry_after", [1, None], ids=["retry-after", "no-retry-after"])
def test_a_storm_of_429s_past_the_retry_window_pauses_the_run_saying_so_and_resume_retries(
    retry_after: float | None, stub: OpenAIStub, llm_goal: Callable[..., Goal],
    engineer: User, django_capture_on_commit_callbacks: Any, settings: Any,
) -> None:
    """An endpoint that answers every request 429 (an account out of quota does: OpenAI's
    insufficient_quota) pauses the run, in words, once the retry window from its first 429
    is spent, instead of keeping it waiting until its wall-time budget runs out."""
    goal = llm_goal()
    for _ in range(3):
        stub.push(rate_limited(retry_after))
    with django_capture_on_commit_callbacks(execute=False) as queued:
        run = run_start(goal=goal, user=engineer)
        run = step(run)
        assert run.status == AgentRun.Status.RUNNING
        settings.LLM_RETRY_SECONDS = 0  # the window is spent
        run = step(run)

    assert run.status == AgentRun.Status.PAUSED
    assert run.stop_reason.startswith("the model endpoint has rate-limited every request for ")
    assert "(2 tries)" in run.stop_reason and "429" in run.stop_reason
    assert run.stop_reason.endswith("Resume retries")
    assert len(stub.requests) == 2 and steps_queued(queued) == 2  # one request per step task
    assert run.step_count == 0 and run.provider_failing_since is None

    settings.LLM_RETRY_SECONDS = 300
    stub.push(completion(tool_calls=[call("finish", summary="the quota is back")]))
    with django_capture_on_commit_callbacks(execute=False):
        run = run_resume(run=run, user=engineer)
        run = step(run)  # a fresh window: the 429 waits again
        assert run.status == AgentRun.Status.RUNNING
        run = step(run)

    assert run.status == AgentRun.Status.FINISHED and "the quota is back" in run.stop_reason


def test_a_429_never_waits_past_the_retry_window_s_end(
    stub: OpenAIStub, llm_goal: Callable[..., Goal], engineer: User,
    django_capture_on_commit_callbacks: Any, settings: Any,
) -> None:
    goal = llm_goal()
    settings.LLM_RETRY_SECONDS = 10
    stub.push(rate_limited(120))
    with django_capture_on_commit_callbacks(execute=False):
        run = run_start(goal=goal, user=engineer)
        run = step(run)

    [wait] = waits(run)
    assert 0 < wait["retry_in"] <= 10  # the last try at the window's end, then the pause
    [event] = run.events.filter(kind="wait")
    assert "at the retry window's end (the model asked for 120 s)" in event.message


def test_a_5xx_with_retry_after_waits_as_asked_within_the_retry_window(
    stub: OpenAIStub, llm_goal: Callable[..., Goal], engineer: User,
    django_capture_on_commit_callbacks: Any, settings: Any,
) -> None:
    goal = llm_goal()
    unavailable = StubReply(503, server_error(503).body, {"Retry-After": "20"})
    stub.push(unavailable)
    stub.push(unavailable)
    with django_capture_on_commit_callbacks(execute=False):
        run = run_start(goal=goal, user=engineer)
        run = step(run)
        assert waits(run)[0]["retry_in"] == 20  # the server's wait, longer than the backoff
        assert run.state["provider_attempts"] == 1  # a fault, backed off as one

        settings.LLM_RETRY_SECONDS = 0
        run = step(run)

    assert run.status == AgentRun.Status.PAUSED
    assert "503" in run.stop_reason and "(2 tries)" in run.stop_reason


def test_an_endpoint_that_refuses_the_key_fails_the_run_at_once(
    stub: OpenAIStub, llm_goal: Callable[..., Goal], engineer: User,
    django_capture_on_commit_callbacks: Any,
) -> None:
    goal = llm_goal()
    stub.push(StubReply(401, {"error": {"message": "bad key", "type": "auth", "param": None,
                                        "code": None}}))
    with django_capture_on_commit_callbacks(execute=False):
        run = run_start(goal=goal, user=engineer)
        run = step(run)

    assert run.status == AgentRun.Status.FAILED
    assert "refused the request" in run.stop_reason and "401" in run.stop_reason
    assert len(stub.requests) == 1  # no retry: none would help
    assert json.dumps(waits(run)) == "[]"
