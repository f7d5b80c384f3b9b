"""What the LLM reads each turn: older steps keep their tool, verdict, paths, refusal reasons
and experiment id; the ledger (with the experiments that tested each entry) and the current
diff are in every turn, the diff once; the boundary and every budget as they are; a system
prompt that fits the goal's kind; the whole stays within MAX_CONTEXT_CHARS."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User

from agents.models import AgentRun, Hypothesis, Step
from agents.policies import llm as policy
from agents.policies.shared import boundary, ensure_worktree
from agents.scripted.endpoint import OpenAIStub, completion
from agents.services import run_start
from infraops.manifest import parse_manifest
from infraops.models import Experiment, Goal, Target
from tests.agents.test_llm_runs import call, scripted_run
from tests.factories import ExperimentFactory

KIND_MANIFEST = """
[[probe]]
name = "latency-bench"
layer = "performance"
command = "python3 bench.py"
metrics = ["latency_ms"]

[[probe]]
name = "cp-equivalence"
layer = "correctness"
command = "python3 eq.py"

[[probe]]
name = "cp-merge"
layer = "performance"
command = "python3 merge.py"
metrics = ["rel_error", "max_rel_error"]
"""


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


def test_the_protected_paths_and_every_budget_are_shown_as_they_really_are(
    stub: OpenAIStub, llm_goal: Callable[..., Goal], engineer: User,
    django_capture_on_commit_callbacks: Any,
) -> None:
    run = started(llm_goal, engineer, django_capture_on_commit_callbacks)

    brief = json.loads(messages_of(run)[1]["content"])

    # The goal's boundary protects nothing itself; the manifest and the probe's files are.
    assert brief["protected_paths"] == list(boundary(run).protected)
    assert "infraops.toml" in brief["protected_paths"] and len(brief["protected_paths"]) > 1
    assert set(brief["budgets_left"]) == {"steps", "experiments", "tokens", "minutes",
                                          "cost_usd"}
    spec = run.goal_version.spec["boundary"]
    assert brief["budgets_left"]["minutes"] in (spec["max_wall_minutes"],
                                                spec["max_wall_minutes"] - 1)
    assert brief["budgets_left"]["cost_usd"] == float(spec["max_cost_usd"])
    assert None not in brief["goal"].values()


@pytest.mark.parametrize(("probe", "metric", "criteria", "kind"), [
    ("latency-bench", "latency_ms", [("latency-bench", "latency_ms")], "speed"),
    ("cp-equivalence", "wall_ms", [], "correctness"),
    ("cp-merge", "max_rel_error", [("cp-merge", "max_rel_error")], "correctness"),
    ("latency-bench", "latency_ms", [("cp-equivalence", "wall_ms")], "both"),
    ("cp-merge", "max_rel_error", [("latency-bench", "latency_ms")], "both"),
], ids=["speed", "correctness-probe", "error-metric", "speed-with-a-check", "error-and-speed"])
def test_the_goals_kind_comes_from_its_probe_metric_and_criteria(
        probe: str, metric: str, criteria: list[tuple[str, str]], kind: str) -> None:
    manifest = parse_manifest(KIND_MANIFEST)
    spec = {"probe": probe, "metric": metric,
            "criteria": [{"probe": p, "metric": m} for p, m in criteria]}

    assert policy.goal_kind(spec, manifest) == kind


def test_a_correctness_goal_is_not_told_to_make_the_code_faster(
    demo: Target, engineer: User, demo_model: OpenAIStub,
    django_capture_on_commit_callbacks: Any,
) -> None:
    goal = Goal.objects.get(target=demo, name__startswith="Numerics, by the LLM agent")
    with django_capture_on_commit_callbacks(execute=False):
        run = run_start(goal=goal, user=engineer)

    system = messages_of(run)[0]["content"]

    assert "make a codebase correct" in system and "faster without breaking" not in system


def test_each_diff_goes_out_once_per_request_and_old_steps_keep_paths_and_reasons(
    stub: OpenAIStub, llm_goal: Callable[..., Goal], engineer: User,
    django_capture_on_commit_callbacks: Any,
) -> None:
    goal = llm_goal()
    edit = call("edit_file", path="config/serving.toml", old_text="batch_size = 2",
                new_text="batch_size = 8")
    listings = [[call("list_files", glob=f"*{n}")] for n in range(policy.RECENT_STEPS)]
    script = [[call("edit_file", path="README.md", old_text="a", new_text="b")], [edit],
              [call("show_diff")], *listings, [call("finish", summary="done")]]
    run = scripted_run(stub, goal, engineer, [completion(tool_calls=c) for c in script],
                       django_capture_on_commit_callbacks)

    assert run.is_finished and stub.remaining == 0

    # Request 5: the edit (step 2) and show_diff (step 3) are replayed, the last step's
    # results as they were; the diff itself goes out once, in the state message.
    fifth = json.dumps(stub.requests[4].body)
    assert fifth.count("+batch_size = 8") == 1
    assert "Edited config/serving.toml" in fifth and fifth.count(policy.DIFF_SHOWN) == 2
    last = stub.requests[-1].body["messages"]
    summary = next(m["content"] for m in last if "Earlier steps" in str(m["content"]))
    refused = summary.splitlines()[1]
    assert refused.startswith("step 1: edit_file -> edit_file refused (edit_file README.md "
                              "refused: README.md")
    assert "editable" in refused  # why: outside the editable paths


def test_the_ledger_lists_the_experiments_that_tested_a_recorded_hypothesis(
    stub: OpenAIStub, llm_goal: Callable[..., Goal], engineer: User,
    django_capture_on_commit_callbacks: Any,
) -> None:
    goal = llm_goal()
    script = [[call("record_hypothesis", title="batch 8 lowers latency", status="open",
                    rationale="fixed overhead per batch")],
              [call("edit_file", path="config/serving.toml", old_text="batch_size = 2",
                    new_text="batch_size = 8")],
              [call("run_experiment", reason="batch 8")],
              [call("run_experiment", reason="again")], [call("list_files")]]
    run = scripted_run(stub, goal, engineer, [completion(tool_calls=c) for c in script],
                       django_capture_on_commit_callbacks)

    first, second = run.experiments.order_by("pk")
    state = stub.requests[-1].body["messages"][2]["content"]
    assert f"batch 8 lowers latency (open, by agent; experiments: {first.pk}, {second.pk})" \
        in state
