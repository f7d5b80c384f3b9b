"""What the LLM reads each turn: older steps keep their tool, verdict and experiment id; the
ledger and the current diff are in every turn; the whole stays within MAX_CONTEXT_CHARS."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from django.contrib.auth.models import User

from agents.models import AgentRun, Hypothesis, Step
from agents.policies import llm as policy
from agents.policies.shared import ensure_worktree
from agents.scripted.endpoint import OpenAIStub
from agents.services import run_start
from infraops.models import Experiment, Goal
from tests.factories import ExperimentFactory


def started(llm_goal: Callable[..., Goal], engineer: User, capture: Any) -> AgentRun:
    with capture(execute=False):
        return run_start(goal=llm_goal(max_steps=500), user=engineer)


def add_step(run: AgentRun, number: int, *, content: str = "ok", tool: str = "read_file",
             verdict: str = "", experiment: Experiment | None = None) -> Step:
    call_id = f"call-{number}"
    assistant = {"role": "assistant", "content": f"thinking {number}",
                 "tool_calls": [{"id": call_id, "type": "function",
                                 "function": {"name": tool, "arguments": "{}"}}]}
    return Step.objects.create(
        run=run, number=number, summary=f"summary {number}", tool=tool, verdict=verdict,
        experiment=experiment, arguments={"news": [], "assistant": assistant},
        calls=[{"id": call_id, "name": tool, "arguments": {}, "ok": True, "refusal": None,
                "malformed": False, "content": content, "data": {}}])


def messages_of(run: AgentRun) -> list[dict[str, Any]]:
    run.refresh_from_db()
    return policy.build_messages(run, run.goal_version.spec)


def test_older_steps_keep_their_tool_verdict_and_experiment(
    stub: OpenAIStub, llm_goal: Callable[..., Goal], engineer: User,
    django_capture_on_commit_callbacks: Any,
) -> None:
    run = started(llm_goal, engineer, django_capture_on_commit_callbacks)
    experiment = ExperimentFactory.create(
        target=run.target, candidate_commit="a" * 40, baseline_commit=run.base_commit,
        status=Experiment.Status.SUCCEEDED, feedback={"verdict": "latency improved 1.18x"})
    add_step(run, 1, tool="run_experiment", verdict="run_experiment ok", experiment=experiment)
    for number in range(2, 2 + policy.RECENT_STEPS):
        add_step(run, number)

    text = json.dumps(messages_of(run))

    line = (f"step 1: run_experiment -> run_experiment ok; experiment {experiment.pk} "
            "succeeded (latency improved 1.18x)")
    assert line in text
    assert "thinking 1" not in text  # step 1 is summarised, not replayed
    assert "thinking 2" in text  # the last RECENT_STEPS are verbatim


def test_the_ledger_and_the_current_diff_are_in_every_turn(
    stub: OpenAIStub, llm_goal: Callable[..., Goal], engineer: User,
    django_capture_on_commit_callbacks: Any,
) -> None:
    run = started(llm_goal, engineer, django_capture_on_commit_callbacks)
    Hypothesis.objects.create(run=run, title="Bigger batches amortise dispatch",
                              status="open")
    worktree = ensure_worktree(run)
    config = worktree / "config" / "serving.toml"
    config.write_text(config.read_text().replace("batch_size = 2", "batch_size = 8"))

    state = messages_of(run)[2]["content"]

    assert "Bigger batches amortise dispatch (open, by agent" in state
    assert "+batch_size = 8" in state and "-batch_size = 2" in state
    assert "<untrusted>" in state  # the diff holds repository text


def test_a_large_diff_is_cut_at_the_stated_bound(
    stub: OpenAIStub, llm_goal: Callable[..., Goal], engineer: User,
    django_capture_on_commit_callbacks: Any,
) -> None:
    run = started(llm_goal, engineer, django_capture_on_commit_callbacks)
    worktree = ensure_worktree(run)
    (worktree / "config" / "big.toml").write_text("".join(f"k{n} = {n}\n" for n in range(5000)))

    state = messages_of(run)[2]["content"]

    assert "more characters; show_diff shows" in state
    assert len(state) < policy.CONTEXT_DIFF_CHARS + 2_000


def test_the_conversation_stays_within_its_bound_however_large_the_results(
    stub: OpenAIStub, llm_goal: Callable[..., Goal], engineer: User,
    django_capture_on_commit_callbacks: Any,
) -> None:
    run = started(llm_goal, engineer, django_capture_on_commit_callbacks)
    for number in range(1, 201):
        add_step(run, number, content="x" * 12_000 * 3, verdict=f"read {number}")

    messages = messages_of(run)
    size = len(json.dumps(messages))

    assert size <= policy.MAX_CONTEXT_CHARS
    text = json.dumps(messages)
    assert "thinking 200" in text  # the last step is always replayed
    summary = next(m["content"] for m in messages if "Earlier steps" in str(m["content"]))
    assert len(summary.splitlines()) == policy.SUMMARY_LINES + 1
    assert "older ones left out" in summary
    # Recent steps that did not fit moved into the summary, which still ends just before
    # the first replayed step.
    replayed = [n for n in range(1, 201) if f"thinking {n}\"" in text]
    assert 1 <= len(replayed) < policy.RECENT_STEPS
    assert f"step {replayed[0] - 1}: read_file -> read {replayed[0] - 1}" in summary
