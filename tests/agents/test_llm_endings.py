"""Honest endings and honest progress: a change its own evidence finds wrong is refused with
the findings listed; a run ends in words that say what happened (the LLM agent's submission
itself: tests/agents/test_llm_runs.py); a candidate with an integrity failure never counts as
progress; refusals in a row are stuck."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User

from agents.models import AgentRun
from agents.policies import llm as policy
from agents.policies import tuner
from agents.scripted.endpoint import OpenAIStub, completion
from infraops.models import Experiment, Goal
from reviews.models import Change
from tests.agents.test_llm_runs import call, scripted_run, step
from tests.factories import ChangeFactory, ExperimentFactory

MISMATCH = {"layer": "correctness", "kind": "output-mismatch", "severity": "fail",
            "title": "latency-bench case warm mismatch", "detail": "max abs error 3.0 > 1e-06",
            "evidence": {"probe": "latency-bench", "case": "warm"}}
ALL_ZEROS = {"layer": "integrity", "kind": "degenerate-output", "severity": "fail",
             "title": "latency-bench case warm is all zeros", "detail": "every element is 0",
             "evidence": {"probe": "latency-bench", "case": "warm"}}
FASTER = {"layer": "performance", "kind": "perf-comparison", "severity": "pass",
          "title": "latency-bench latency_ms improved 2.0x", "detail": "", "evidence": {}}


def test_a_change_whose_evidence_fails_correctness_is_refused_with_the_findings_listed(
    stub: OpenAIStub, llm_goal: Callable[..., Goal], engineer: User,
    django_capture_on_commit_callbacks: Any,
) -> None:
    run = scripted_run(stub, llm_goal(), engineer, [completion(tool_calls=[call("list_files")])],
                       django_capture_on_commit_callbacks)
    evidence = ExperimentFactory.create(target=run.target, status=Experiment.Status.SUCCEEDED,
                                        feedback={"findings": [MISMATCH, ALL_ZEROS]})
    run.experiments.add(evidence)
    stub.push(completion(tool_calls=[call("submit_change", title="t", hypothesis="h",
                                          experiment_id=evidence.pk)]))
    stub.push(completion(tool_calls=[call("list_files", glob="*.toml")]))
    with django_capture_on_commit_callbacks(execute=False):
        run = step(step(run))

    assert not Change.objects.exists() and run.status == AgentRun.Status.RUNNING
    [submitted] = run.steps.get(number=2).calls
    assert submitted["refusal"] and not submitted["ok"]
    told = stub.requests[-1].body["messages"][-1]["content"]
    assert MISMATCH["title"] in told and ALL_ZEROS["title"] in told and "Fix" in told


def test_a_candidate_with_an_integrity_failure_never_counts_as_progress() -> None:
    cheating = Experiment(status=Experiment.Status.SUCCEEDED,
                          feedback={"findings": [FASTER, ALL_ZEROS]})
    honest = Experiment(status=Experiment.Status.SUCCEEDED, feedback={"findings": [FASTER]})

    assert policy.progressed(honest, [])
    assert not policy.progressed(cheating, [])


def test_refusals_in_a_row_pause_the_run_as_stuck(
    stub: OpenAIStub, llm_goal: Callable[..., Goal], engineer: User,
    django_capture_on_commit_callbacks: Any,
) -> None:
    refused = [completion(tool_calls=[call("edit_file", path="README.md", old_text="a",
                                           new_text=f"b{n}")])
               for n in range(policy.REFUSALS_BEFORE_STUCK + 2)]

    run = scripted_run(stub, llm_goal(), engineer, refused, django_capture_on_commit_callbacks)

    assert run.status == AgentRun.Status.PAUSED, run.stop_reason
    assert run.step_count == policy.REFUSALS_BEFORE_STUCK
    assert run.stop_reason.startswith(f"stuck: {policy.REFUSALS_BEFORE_STUCK} steps in a row "
                                      "refused (last: README.md")


def test_a_run_the_agent_finishes_without_a_change_says_nothing_was_submitted(
    stub: OpenAIStub, llm_goal: Callable[..., Goal], engineer: User,
    django_capture_on_commit_callbacks: Any,
) -> None:
    run = scripted_run(stub, llm_goal(), engineer, [completion(tool_calls=[
        call("finish", summary="batching does not help here")])],
        django_capture_on_commit_callbacks)

    assert run.status == AgentRun.Status.FINISHED
    assert run.stop_reason == "nothing submitted: batching does not help here"


@pytest.mark.parametrize("submitted", [False, True], ids=["nothing", "a-change"])
def test_a_run_out_of_budget_says_what_it_submitted(
    submitted: bool, stub: OpenAIStub, llm_goal: Callable[..., Goal], engineer: User,
    django_capture_on_commit_callbacks: Any,
) -> None:
    run = scripted_run(stub, llm_goal(max_steps=1), engineer, [completion(tool_calls=[
        call("list_files")])], django_capture_on_commit_callbacks)
    if submitted:
        run.changes.add(ChangeFactory.create(target=run.target))
    with django_capture_on_commit_callbacks(execute=False):
        run = step(run)

    if submitted:
        assert run.status == AgentRun.Status.SUCCEEDED
        assert run.stop_reason == ("step budget spent (1 steps); best so far submitted: "
                                   f"change {run.changes.get().pk}")
    else:
        assert run.status == AgentRun.Status.FAILED
        assert run.stop_reason == "step budget spent (1 steps); nothing submitted"


def test_a_person_stopping_the_tuner_reads_stopped_best_so_far_submitted(
    example_goal: Goal, engineer: User,
) -> None:
    run = AgentRun(state={"stop": True, "stopped_by": "erin"})

    assert tuner._submitted(run, 7) == "stopped by erin, best so far submitted: change 7"
    assert tuner._submitted(AgentRun(state={}), 7) == "submitted change 7"
