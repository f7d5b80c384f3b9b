"""The agent's experiment and workspace tools in scripted LLM runs: a scripted agent
(agents/scripted/agent.py) behind the real local OpenAI-compatible server calls them as a
model would, on the example cases of examples/cases, and reads each result in the request of
the next step. Steps run in this process (one run_step each, as the agent worker would), and
an experiment a step asked for runs here too, sandboxed.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from agents.models import AgentRun, Step
from agents.scripted.agent import Script, ScriptedAgent, Turn, call
from agents.scripted.endpoint import OpenAIStub
from agents.services import run_start
from infraops.models import Experiment, Goal, Target
from infraops.services.targets import target_register
from tests.agents.test_llm_runs import step
from tests.conftest import case_source, make_origin, members_of_new_target
from tests.factories import GoalFactory

NEW_TOOLS = {"list_probes", "probe_error", "compare_experiments", "case_detail", "span_summary"}


@pytest.fixture
def case_goal(db: None, tmp_path: Path, engineer: User, stub: OpenAIStub
              ) -> Callable[..., Goal]:
    def make(case: str, probe: str, metric: str, editable: str) -> Goal:
        origin = make_origin(tmp_path, case_source(tmp_path, case), f"{case}.git")
        target: Target = members_of_new_target(
            target_register(name=case, repo_url=str(origin), base_branch="main"))
        return GoalFactory.create(target=target, name=f"{case} agent", probe=probe,
                                  metric=metric, policy=Goal.Policy.LLM, owner=engineer,
                                  boundary__editable_paths=editable, snapshot_by=engineer)

    return make


def drive(goal: Goal, engineer: User, agent: ScriptedAgent, stub: OpenAIStub,
          capture: Any, steps: int) -> AgentRun:
    """Start the run and take its steps in this process until it ends (at most `steps`)."""
    agent.install(stub)
    with capture(execute=False):
        run = run_start(goal=goal, user=engineer)
        for _ in range(steps):
            run = step(run)
            if run.is_finished or run.status == AgentRun.Status.PAUSED or stub.errors:
                break
    assert not stub.errors, f"the scripted agent failed: {stub.errors[0]}"
    return run


def assert_each_result_reached_the_model(run: AgentRun, stub: OpenAIStub) -> None:
    """Step n's tool results, exactly as recorded, are in request n + 1 as tool messages
    answering its calls."""
    steps = list(Step.objects.filter(run=run).order_by("number"))
    for record in steps[:-1]:  # the last step's results have no next request
        messages = stub.requests[record.number].body["messages"]
        answers = {m["tool_call_id"]: m["content"] for m in messages if m["role"] == "tool"}
        for entry in record.calls:
            assert answers.get(entry["id"]) == entry["content"], (record.number, entry["name"])


def test_a_scripted_run_uses_the_experiment_tools_on_a_crash_a_fix_and_a_comparison(
    stub: OpenAIStub, case_goal: Callable[..., Goal], engineer: User,
    django_capture_on_commit_callbacks: Any,
) -> None:
    goal = case_goal("kda-cp-precision", "cp-equivalence", "wall_ms", "kda/**")
    seen: dict[str, Any] = {}

    def script(first: Turn) -> Script:
        seen["offered"] = {t["function"]["name"] for t in first.request.body["tools"]}
        turn = yield [call("list_probes")]

        seen["list_probes"] = probes = turn.result("list_probes")
        cells = re.search(r"variant cells \(\d+\): (.+)", probes)
        assert cells, probes
        on = next(c for c in re.findall(r"\[([^\]]+)\]", cells.group(1)) if c.endswith("=on"))
        turn = yield [call("read_file", path="kda/merge.py")]

        header = re.search(r"^\s*\d+\t(def dot\(a, b\):)$", turn.result("read_file"), re.M)
        assert header, turn.result("read_file")
        # Drop the colon: a syntax error the edit reports (and keeps) and the probe crashes on.
        turn = yield [call("edit_file", path="kda/merge.py", old_text=header.group(1),
                           new_text=header.group(1).rstrip(":"))]

        seen["broken_edit"] = turn.result("edit_file")
        turn = yield [call("run_experiment", probes=["cp-equivalence"],
                           variants={"cp-equivalence": [on]}, reason="does cp=on still run?")]

        crashed = int(re.findall(r"Experiment (\d+) queued", turn.result("run_experiment"))[0])
        seen["crashed"], seen["crash_news"] = crashed, turn.experiment_news(crashed)
        turn = yield [call("probe_error", experiment_id=crashed, probe="cp-equivalence")]

        seen["probe_error"] = turn.result("probe_error")
        turn = yield [call("revert", last_edit=True)]

        seen["revert"] = turn.result("revert")
        turn = yield [call("show_diff")]

        seen["clean_diff"] = turn.result("show_diff")
        turn = yield [call("edit_file", path="kda/merge.py", old_text='INPUT_PRECISION = "tf32"',
                           new_text='INPUT_PRECISION = "tf32x3"'),
                      call("run_experiment", probes=["cp-equivalence"], reason="tf32x3")]

        fixed = int(re.findall(r"Experiment (\d+) queued", turn.result("run_experiment"))[0])
        seen["fixed"] = fixed
        turn = yield [call("case_detail", experiment_id=fixed, probe="cp-equivalence",
                           case="len-4096"),
                      call("compare_experiments", first_id=crashed, second_id=fixed)]

        seen["case_detail"] = turn.result("case_detail")
        seen["compare"] = turn.result("compare_experiments")
        yield [call("finish", summary="crash found, reverted, fixed, compared")]

    agent = ScriptedAgent(script)
    run = drive(goal, engineer, agent, stub, django_capture_on_commit_callbacks, 12)

    assert run.status == AgentRun.Status.FINISHED, (run.stop_reason, agent.failure)
    assert seen["offered"] >= NEW_TOOLS
    # list_probes: the probe, its cells and its compare rule.
    assert "- cp-equivalence (correctness, cost 1): covers kda/**" in seen["list_probes"]
    assert "variant cells (2): [cp=off], [cp=on]" in seen["list_probes"]
    assert "compare: [cp=on] must match [cp=off] (rtol 0.0001, atol 0.0001)" \
        in seen["list_probes"]
    # The edit's syntax check said what is wrong, and where; the edit stayed.
    assert re.search(r"Syntax error in kda/merge\.py line \d+: ", seen["broken_edit"]), \
        seen["broken_edit"]
    # The subset ran: one probe, one cell; it crashed on the candidate, and probe_error says
    # where, how, and with the end of the stderr.
    crashed = Experiment.objects.get(pk=seen["crashed"])
    assert crashed.probes == ["cp-equivalence"]
    assert crashed.variants == {"cp-equivalence": ["cp=on"]}, "the variant subset was lost"
    assert {e.variant for e in crashed.executions.all()} == {"cp=on"}
    error = seen["probe_error"]
    assert f"Experiment {crashed.pk} ({crashed.status}): " in error
    assert "The first: cp-equivalence candidate [cp=on]" in error, error
    assert re.search(r"Exit: exit status [1-9]\d*", error), error
    assert "SyntaxError" in error and "Stderr (the end):" in error
    assert "Reproduce: " in error
    # revert undid the broken edit; show_diff then shows nothing left.
    assert seen["revert"].startswith("Undid the last write (edit_file"), seen["revert"]
    assert "No changes: the worktree is as it is at the base commit" in seen["clean_diff"]
    # The fix: case_detail gives the case's numbers, compare_experiments both experiments.
    fixed = Experiment.objects.get(pk=seen["fixed"])
    assert fixed.status == Experiment.Status.SUCCEEDED, fixed.failure_reason
    detail = seen["case_detail"]
    assert re.search(r"^\[cp=on\] vs \[cp=off\] \(candidate\) \(rtol 0\.0001, atol 0\.0001\):\n"
                     r"(  error vs size: .*\n)?  case len-4096: pass; max abs error ", detail,
                     re.M), detail
    compare = seen["compare"]
    assert f"#{crashed.pk}: {crashed.status}, candidate " in compare, compare
    assert "(cells cp-equivalence: cp=on)" in compare
    assert f"#{fixed.pk}: succeeded" in compare and "Criteria:" in compare
    # Every call recorded, every result read by the model at the next step.
    calls = [c for s in Step.objects.filter(run=run).order_by("number") for c in s.calls]
    assert [c["name"] for c in calls] == [
        "list_probes", "read_file", "edit_file", "run_experiment", "probe_error", "revert",
        "show_diff", "edit_file", "run_experiment", "case_detail", "compare_experiments",
        "finish"]
    assert all(c["ok"] for c in calls), [c for c in calls if not c["ok"]]
    assert_each_result_reached_the_model(run, stub)
    # Probe output reached the model only as data.
    probe_error = next(c for c in calls if c["name"] == "probe_error")
    assert probe_error["content"].startswith("<untrusted>")


def test_a_scripted_run_reads_a_span_of_the_probes_traces(
    stub: OpenAIStub, case_goal: Callable[..., Goal], engineer: User,
    django_capture_on_commit_callbacks: Any,
) -> None:
    # kv-transfer-gil is the example whose probe writes a trace.json (its spans: compute,
    # dispatch, combine, wait_kv on the main thread, kv_transfer on the transfer thread).
    goal = case_goal("kv-transfer-gil", "prefill-kv", "step_ms", "engine/**")
    seen: dict[str, Any] = {}

    def script(first: Turn) -> Script:
        turn = yield [call("run_experiment", probes=["prefill-kv"],
                           variants={"prefill-kv": ["scenario=prefill_kv"]},
                           reason="where does the transfer's time go?")]

        experiment = int(re.findall(r"Experiment (\d+) queued",
                                    turn.result("run_experiment"))[0])
        seen["experiment"] = experiment
        turn = yield [call("span_summary", experiment_id=experiment, span="kv_transfer"),
                      call("span_summary", experiment_id=experiment, span="no_such_span")]

        seen["span"], seen["missing"] = (r.content for r in turn.results)
        yield [call("finish", summary="read the transfer span")]

    agent = ScriptedAgent(script)
    run = drive(goal, engineer, agent, stub, django_capture_on_commit_callbacks, 5)

    assert run.status == AgentRun.Status.FINISHED, (run.stop_reason, agent.failure)
    experiment = Experiment.objects.get(pk=seen["experiment"])
    assert experiment.variants == {"prefill-kv": ["scenario=prefill_kv"]}, \
        "the variant subset was lost"
    span = seen["span"]
    assert f"Span kv_transfer in experiment {experiment.pk}" in span, span
    assert "prefill-kv [scenario=prefill_kv]:" in span
    assert re.search(r"candidate: \d+ spans, total [\d.]+ [µm]?s", span), span
    assert re.search(r"baseline: \d+ spans", span) and "overlapped by: " in span
    # An unknown span is a structured error naming the spans there are.
    assert "no span 'no_such_span'" in seen["missing"] and "kv_transfer" in seen["missing"]
    calls = [c for s in Step.objects.filter(run=run).order_by("number") for c in s.calls]
    assert [(c["name"], c["ok"]) for c in calls] == [
        ("run_experiment", True), ("span_summary", True), ("span_summary", False),
        ("finish", True)]
    assert_each_result_reached_the_model(run, stub)
