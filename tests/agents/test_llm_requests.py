"""Every request the agent sends is a Chat Completions request as OpenAI's published schema
says (tests/agents/openai_spec.py: the vendored schema and the server's own rules): the
requests of whole scripted runs are recorded by the local stub and each is validated. Then
the two traps a real server sets that the stub alone would let through: an answer with no
tool call sent back as ``"tool_calls": []`` (400 ``empty_array``), and an answer cut at the
model's output limit (``finish_reason: "length"``). Last, the validator on requests a real
server refuses: a contract test passes vacuously on a validator that finds nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User

from agents.models import AgentRun
from agents.policies.shared import run_worktree
from agents.scripted.endpoint import (
    OpenAIStub,
    StubReply,
    completion,
    rate_limited,
    server_error,
)
from agents.services import run_start
from infraops.models import Goal, Target
from tests.agents.openai_spec import request_problems
from tests.agents.test_llm_runs import call, scripted_run
from tests.agents.test_showcase import BY_THE_LLM, drive, goal

CUT_EDIT = '{"path": "config/serving.toml", "old_text": "batch_size = 2", "new_te'

SCENARIOS: dict[str, list[StubReply]] = {
    "plain words, then tools": [
        completion("I will read the serving configuration first."),
        completion(tool_calls=[call("list_files")]),
        completion(tool_calls=[call("finish", summary="nothing to do")])],
    "a tool call per step": [
        completion(tool_calls=[call("read_file", path="config/serving.toml")]),
        completion(tool_calls=[call("edit_file", path="config/serving.toml",
                                    old_text="batch_size = 2", new_text="batch_size = 8")]),
        completion(tool_calls=[call("run_experiment", reason="batch 8")]),
        completion(tool_calls=[call("show_diff")]),
        completion(tool_calls=[call("finish", summary="measured")])],
    "two calls in one message": [
        completion(tool_calls=[call("record_hypothesis", title="batch 8 lowers latency",
                                    status="open", rationale="fixed overhead per batch"),
                               call("read_file", path="config/serving.toml")]),
        completion(tool_calls=[call("list_files"), call("no_such_tool")]),
        completion(tool_calls=[call("finish", summary="done")])],
    "content beside calls": [
        completion("Batching should amortise the dispatch overhead.",
                   tool_calls=[call("read_file", path="config/serving.toml")]),
        completion("A refusal next.", tool_calls=[call("edit_file", path="README.md",
                                                       old_text="a", new_text="b")]),
        completion("Done.", tool_calls=[call("finish", summary="done")])],
    "retries": [
        server_error(500), completion(tool_calls=[call("list_files")]),
        rate_limited(0.1), completion(tool_calls=[call("read_file", path="config/serving.toml")]),
        completion(tool_calls=[call("finish", summary="done")])],
    "an answer cut at the length limit": [
        completion(tool_calls=[("edit_file", CUT_EDIT)], finish_reason="length",
                   usage=(900, 4096)),
        completion(tool_calls=[call("list_files")]),
        completion(tool_calls=[call("finish", summary="done")])],
}


def problems_of(stub: OpenAIStub) -> dict[int, list[str]]:
    found = {number: request_problems(request.body)
             for number, request in enumerate(stub.requests, 1)}
    return {number: problems for number, problems in found.items() if problems}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_every_request_of_a_scripted_run_validates_against_openais_schema(
    scenario: str, stub: OpenAIStub, llm_goal: Callable[..., Goal], engineer: User,
    django_capture_on_commit_callbacks: Any,
) -> None:
    run = scripted_run(stub, llm_goal(), engineer, SCENARIOS[scenario],
                       django_capture_on_commit_callbacks)

    assert stub.remaining == 0 and run.is_finished, (run.status, run.stop_reason)
    assert len(stub.requests) == len(SCENARIOS[scenario])
    assert problems_of(stub) == {}
    assert all(r.body["tool_choice"] == "auto" and r.body["tools"] for r in stub.requests)


def test_every_request_of_the_demos_precision_fix_validates_against_openais_schema(
    demo: Target, engineer: User, demo_model: OpenAIStub,
    django_capture_on_commit_callbacks: Any,
) -> None:
    with django_capture_on_commit_callbacks(execute=False):
        run = drive(run_start(goal=goal(demo, BY_THE_LLM), user=engineer), steps=15)

    assert run.status == AgentRun.Status.SUCCEEDED, run.stop_reason
    assert len(demo_model.requests) >= 9
    assert problems_of(demo_model) == {}


def test_an_answer_without_tool_calls_goes_back_without_an_empty_tool_calls_array(
    stub: OpenAIStub, llm_goal: Callable[..., Goal], engineer: User,
    django_capture_on_commit_callbacks: Any,
) -> None:
    scripted_run(stub, llm_goal(), engineer, SCENARIOS["plain words, then tools"][:2],
                 django_capture_on_commit_callbacks)

    second = stub.requests[1].body["messages"]
    said = [m for m in second if m["role"] == "assistant"]
    assert said == [{"role": "assistant",
                     "content": "I will read the serving configuration first."}]
    # The model is told that words alone do nothing, after its own words.
    after = second[second.index(said[0]) + 1:]
    assert after and after[0]["role"] == "user" and "no tool" in after[0]["content"]


def test_an_answer_cut_at_the_length_limit_is_not_run_and_the_model_is_asked_again(
    stub: OpenAIStub, llm_goal: Callable[..., Goal], engineer: User,
    django_capture_on_commit_callbacks: Any,
) -> None:
    run = scripted_run(stub, llm_goal(), engineer,
                       SCENARIOS["an answer cut at the length limit"][:2],
                       django_capture_on_commit_callbacks)

    first = run.steps.get(number=1)
    assert first.calls == [] and "cut" in first.verdict  # the cut call never ran
    assert "batch_size = 2" in (run_worktree(run) / "config" / "serving.toml").read_text()
    assert run.step_count == 2 and run.tokens_used >= 900 + 4096  # counted in the budgets
    second = stub.requests[1].body["messages"]
    assert not any(m.get("tool_calls") for m in second if m["role"] == "assistant")
    told = [m["content"] for m in second if m["role"] == "user" and "cut off" in m["content"]]
    assert told and "length" in told[0] and "not run" in told[0]


# --- the validator itself: what a real server refuses, it finds ------------------------------

ASKED = {"role": "user", "content": "Make it faster."}
A_TOOL = {"type": "function", "function": {
    "name": "list_files", "description": "List files.",
    "parameters": {"type": "object", "properties": {"glob": {"type": "string"}}}}}
VALID = {"model": "m", "messages": [ASKED], "tools": [A_TOOL], "tool_choice": "auto"}


@pytest.mark.parametrize(("change", "found"), [
    ({"messages": [ASKED, {"role": "assistant", "content": "ok", "tool_calls": []}]},
     "/messages/1/tool_calls: empty array"),
    ({"tools": []}, "/tools: empty array"),
    ({"messages": [ASKED, {"role": "assistant", "content": None}]},
     "messages/1: an assistant message with neither content nor tool calls"),
    ({"messages": [ASKED, {"role": "tool", "tool_call_id": "call_9", "content": "x"}]},
     "messages/1: a tool result answers no open call"),
    ({"messages": [ASKED, {"role": "assistant", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "list_files",
                                                          "arguments": "{}"}}]}, ASKED]},
     "messages/2: calls ['call_1'] got no result"),
    ({"tool_choice": "sometimes"}, "tool_choice: "),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "messages/0: "),
], ids=["empty-tool-calls", "empty-tools", "assistant-says-nothing", "result-without-call",
        "call-without-result", "bad-tool-choice", "unknown-role"])
def test_the_validator_finds_what_openai_s_server_refuses(change: dict[str, Any],
                                                          found: str) -> None:
    """The contract test above is only as good as its validator: a request the server would
    answer with 400 gives a problem here, and the same request without the fault gives none."""
    assert request_problems(VALID) == []
    problems = request_problems(VALID | change)
    assert any(problem.startswith(found) for problem in problems), problems
