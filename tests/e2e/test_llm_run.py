"""An LLM run through the real processes: the agent worker talks to a real local
OpenAI-compatible server, experiments run on the experiments worker, and the change lands in
the review queue; a person's message reaches the model mid-run."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User

from agents.models import AgentRun
from agents.scripted.endpoint import OpenAIStub, completion
from agents.services import run_message_add, run_start
from infraops.models import AcceptanceCriterion, Boundary, Experiment, Goal, Target
from infraops.services.goals import goal_snapshot
from reviews.models import Change

pytestmark = pytest.mark.e2e
API_KEY = "sk-e2e-secret-key-000111222333"


@pytest.fixture
def stub() -> Iterator[OpenAIStub]:
    with OpenAIStub() as server:
        yield server


@pytest.fixture
def live_env(stub: OpenAIStub) -> dict[str, str]:
    return {"OPENAI_BASE_URL": stub.base_url, "OPENAI_API_KEY": API_KEY,
            "INFRAOPS_MODEL": "stub-model"}


def call(name: str, **arguments: Any) -> tuple[str, str]:
    return (name, json.dumps(arguments))


def wait_for(what: str, check: Callable[[], Any], timeout: float = 90) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_an_llm_run_on_real_workers_reaches_the_review_queue(
    stub: OpenAIStub, live_system: str, example_target: Target, engineer: User, reviewer: User,
    settings: Any,
) -> None:
    settings.OPENAI_BASE_URL, settings.INFRAOPS_MODEL = stub.base_url, "stub-model"
    goal = Goal.objects.create(target=example_target, name="llm", probe="latency-bench",
                               metric="latency_ms", policy=Goal.Policy.LLM, owner=engineer)
    Boundary.objects.create(goal=goal, editable_paths="config/**")
    AcceptanceCriterion.objects.create(goal=goal, kind="relative", probe="latency-bench",
                                       metric="latency_ms", comparison="<=", value=-0.05)
    goal_snapshot(goal=goal, user=engineer)
    stub.push(completion(tool_calls=[
        call("record_hypothesis", title="batch 8 amortises dispatch", status="open"),
        call("edit_file", path="config/serving.toml", old_text="batch_size = 2",
             new_text="batch_size = 8")]))
    stub.push(completion(tool_calls=[call("run_experiment", reason="batch 8")]))

    run = run_start(goal=goal, user=engineer)
    experiment = wait_for("the experiment", lambda: Experiment.objects.first())
    run_message_add(run=run, user=reviewer, text="Keep max_queue as it is.")
    stub.push(completion(tool_calls=[call(
        "submit_change", title="Batch 8", hypothesis="batch 8 amortises dispatch",
        experiment_id=experiment.pk)]))
    stub.push(completion(tool_calls=[call("finish", summary="done")]))

    run = wait_for("the run to end", lambda: AgentRun.objects.filter(
        pk=run.pk, status__in=["succeeded", "failed", "paused"]).first())
    assert run.status == AgentRun.Status.SUCCEEDED, run.stop_reason
    change = Change.objects.get()
    assert change.status == Change.Status.PENDING_REVIEW
    assert "+batch_size = 8" in change.diff
    assert len(stub.requests) == 4
    third = json.dumps(stub.requests[2].body["messages"])
    assert "Keep max_queue as it is." in third
    assert f"Experiment {experiment.pk} succeeded" in third
    assert all(API_KEY not in r.raw.decode() for r in stub.requests)
