"""The agent loop through the real processes, with a model played by test code: a scripted
agent (agents/scripted/agent.py) behind the real local OpenAI-compatible server reads what
each request carries (tool results, experiment feedback) and decides its next call from it,
as a model would. Steps run on the agent worker, experiments on the experiments worker.

- A real precision bug (the demo's kda/merge.py under examples/cases/kda-cp-precision.toml:
  the context-parallel merge's dot in TF32) is found and fixed from the feedback alone, and the
  fix reaches the review queue.
- A failing model endpoint (429, 500s, dropped connections) is waited out with backoff, pauses
  the run past the retry window, and Resume completes it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from agents.models import AgentRun, Step
from agents.scripted.agent import Script, ScriptedAgent, Turn, call
from agents.scripted.endpoint import OpenAIStub, rate_limited, server_error
from agents.services import run_resume, run_start
from infraops.models import Boundary, Experiment, Goal, Target
from infraops.services.goals import goal_snapshot
from infraops.services.targets import target_register
from reviews.models import Change
from tests.conftest import case_source, make_origin, members_of_new_target

pytestmark = pytest.mark.e2e
API_KEY = "sk-e2e-agent-loop-key-445566778899"
ENDED = ["succeeded", "failed", "finished", "cancelled", "paused"]
RUN_DEADLINE = 900  # seconds; generous: a loaded 2-core machine runs two workers and probes


@pytest.fixture
def stub() -> Iterator[OpenAIStub]:
    with OpenAIStub() as server:
        yield server


@pytest.fixture
def retry_seconds() -> str:
    """INFRAOPS_LLM_RETRY_SECONDS of the workers (a test parametrizes it to change it)."""
    return "300"


@pytest.fixture
def live_env(stub: OpenAIStub, retry_seconds: str) -> dict[str, str]:
    return {"OPENAI_BASE_URL": stub.base_url, "OPENAI_API_KEY": API_KEY,
            "INFRAOPS_MODEL": "stub-model", "INFRAOPS_LLM_RETRY_SECONDS": retry_seconds}


@pytest.fixture
def kda_target(transactional_db: None, tmp_path: Path) -> Target:
    origin = make_origin(tmp_path, case_source(tmp_path, "kda-cp-precision"),
                         "kda-cp-precision.git")
    return members_of_new_target(
        target_register(name="kda-cp-precision", repo_url=str(origin), base_branch="main"))


@pytest.fixture
def kda_goal(kda_target: Target, engineer: User, stub: OpenAIStub, settings: Any) -> Goal:
    """An LLM goal on the KDA case: only kda/** is editable. There is no correctness kind of
    acceptance criterion (threshold, relative, relation): the probe's compare rule (cp=on
    must match cp=off within rtol/atol 1e-4) is the correctness check."""
    settings.OPENAI_BASE_URL, settings.INFRAOPS_MODEL = stub.base_url, "stub-model"
    goal = Goal.objects.create(target=kda_target, name="cp matches the reference",
                               probe="cp-equivalence", metric="wall_ms",
                               policy=Goal.Policy.LLM, owner=engineer)
    Boundary.objects.create(goal=goal, editable_paths="kda/**")
    goal_snapshot(goal=goal, user=engineer)
    return goal


def wait_for(what: str, check: Callable[[], Any], stub: OpenAIStub,
             timeout: float = RUN_DEADLINE) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        if stub.errors:  # the scripted agent failed: say why rather than wait for nothing
            raise AssertionError(f"the scripted agent failed while waiting for {what}: "
                                 f"{stub.errors[0]}")
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}; stub errors: {stub.errors}")


def ended(run: AgentRun, stub: OpenAIStub, statuses: list[str] = ENDED) -> AgentRun:
    found: AgentRun = wait_for(f"run {run.pk} to reach {statuses}", lambda: AgentRun.objects.filter(
        pk=run.pk, status__in=statuses).first(), stub)
    return found


def waits(run: AgentRun) -> list[dict[str, Any]]:
    return [e.data for e in run.events.filter(kind="wait").order_by("seq")]


def no_key_sent(stub: OpenAIStub) -> None:
    assert stub.requests
    assert all(API_KEY not in r.raw.decode("utf-8", "replace") for r in stub.requests)
    assert all(r.headers.get("authorization") == f"Bearer {API_KEY}" for r in stub.requests)


# --- a precision bug, fixed from the feedback alone ------------------------------------------

# One finding per cause: "... (candidate) cases len-4096, len-1024 mismatch: case len-4096:
# ...", its cases worst first and the worst one's detail first.
FAIL_LINE = re.compile(
    r"\[FAIL correctness\] (?P<probe>\S+) \[(?P<candidate>[^\]]+)\] vs \[(?P<reference>[^\]]+)\]"
    r" \(candidate\) cases? (?P<case>[^\s,]+)[^:]*? mismatch: .*?first at (?P<index>\[[\d, ]+\]): "
    r"(?P<ref>-?[\d.e+-]+) vs (?P<cand>-?[\d.e+-]+) .*?max abs (?P<max_abs>[\d.e+-]+).*?"
    r"\(rtol (?P<rtol>[\d.e+-]+), atol (?P<atol>[\d.e+-]+)\)")


def precision_fixer(seen: dict[str, Any]) -> Callable[[Turn], Script]:
    """The agent of the precision case. Each decision comes from what the last request said;
    `seen` keeps what it read, for the test's assertions."""

    def script(first: Turn) -> Script:
        seen["offered"] = sorted(t["function"]["name"] for t in first.request.body["tools"])
        turn = yield [call("list_probes")]

        # The correctness probe, its variant cells and its compare rule, from list_probes.
        probes = seen["list_probes"] = turn.result("list_probes")
        probe = re.search(r"^- (\S+) \(correctness, cost", probes, re.M)
        rule = re.search(r"compare: \[([^\]]+)\] must match \[([^\]]+)\] \(rtol ([^,]+), "
                         r"atol ([^)]+)\)", probes)
        cells = re.search(r"variant cells \(\d+\): (.+)", probes)
        assert probe and rule and cells, probes
        name = probe.group(1)
        seen["rule"] = rule.groups()
        variants = {name: re.findall(r"\[([^\]]+)\]", cells.group(1))}
        turn = yield [call("run_experiment", probes=[name], variants=variants,
                           reason="Does the unchanged context-parallel path match?")]

        # The feedback of the unchanged code: which case mismatches, by how much.
        queued = re.search(r"Experiment (\d+) queued", turn.result("run_experiment"))
        assert queued, turn.result("run_experiment")
        base = seen["base_experiment"] = int(queued.group(1))
        news = seen["base_news"] = turn.experiment_news(base)
        failing = [m.groupdict() for m in FAIL_LINE.finditer(news)]
        assert failing, news
        worst = max(failing, key=lambda m: float(m["max_abs"]))
        seen["worst"] = worst
        turn = yield [call("case_detail", experiment_id=base, probe=name, case=worst["case"])]

        seen["case_detail"] = detail = turn.result("case_detail")
        assert f"case {worst['case']}: FAIL" in detail, detail
        # Where the parallel path's numerics come from: the merge's dot.
        turn = yield [call("search_code", pattern=r"^INPUT_PRECISION\s*=", path_glob="kda/**")]

        hit = re.search(r"^(\S+\.py):\d+: INPUT_PRECISION", turn.result("search_code"), re.M)
        assert hit, turn.result("search_code")
        path = hit.group(1)
        turn = yield [call("read_file", path=path)]

        source = seen["read_file"] = turn.result("read_file")
        line = re.search(r'^\s*\d+\t(INPUT_PRECISION = "(\w+)")$', source, re.M)
        assert line, source
        seen["old_line"], seen["old_value"] = line.group(1), line.group(2)
        assert '"tf32x3"' in source  # the module offers the split-precision dot
        turn = yield [call("edit_file", path=path, old_text=line.group(1),
                           new_text='INPUT_PRECISION = "tf32x3"')]

        seen["edit_file"] = turn.result("edit_file")
        turn = yield [call("show_diff")]

        seen["show_diff"] = diff = turn.result("show_diff")
        assert '+INPUT_PRECISION = "tf32x3"' in diff, diff
        turn = yield [call("run_experiment", probes=[name], variants=variants,
                           reason="tf32x3 should bring cp=on within 1e-4 of cp=off")]

        queued = re.search(r"Experiment (\d+) queued", turn.result("run_experiment"))
        assert queued, turn.result("run_experiment")
        fixed = seen["fixed_experiment"] = int(queued.group(1))
        news = seen["fixed_news"] = turn.experiment_news(fixed)
        assert f"Experiment {fixed} succeeded" in news, news
        assert "[FAIL" not in news, news
        candidate, reference = rule.group(1), rule.group(2)
        passing = f"[PASS correctness] {name} [{candidate}] vs [{reference}] (candidate): all"
        assert passing in news, news
        assert f"[PASS correctness] {name} [{candidate}] vs [{reference}] fixed: " in news, news
        turn = yield [call("submit_change", title="Merge dot in tf32x3",
                           hypothesis="The CP merge's TF32 dot accumulates error across "
                                      "shards; tf32x3 keeps it within the reference's 1e-4.",
                           experiment_id=fixed)]

        seen["submit_change"] = turn.result("submit_change")
        yield [call("finish", summary=f"Fixed the CP mismatch of {worst['case']}: "
                                      f"INPUT_PRECISION tf32 -> tf32x3.")]

    return script


def test_a_precision_bug_is_fixed_from_the_feedback_alone(
    stub: OpenAIStub, live_system: str, kda_goal: Goal, engineer: User,
) -> None:
    seen: dict[str, Any] = {}
    agent = ScriptedAgent(precision_fixer(seen))
    agent.install(stub)

    run = run_start(goal=kda_goal, user=engineer)
    run = ended(run, stub)

    assert stub.errors == [], stub.errors
    assert run.status == AgentRun.Status.SUCCEEDED, (run.stop_reason, agent.failure)
    assert "INPUT_PRECISION tf32 -> tf32x3" in run.stop_reason
    # The new tools were offered to the model, and list_probes said what to run.
    assert {"list_probes", "case_detail", "probe_error", "compare_experiments",
            "span_summary"} <= set(seen["offered"])
    assert seen["rule"] == ("cp=on", "cp=off", "0.0001", "0.0001")
    # The feedback the model was sent named the mismatch: the case, where, the values there
    # and the tolerance; case_detail gave its numbers.
    worst = seen["worst"]
    assert worst["probe"] == "cp-equivalence" and worst["case"].startswith("len-")
    assert (worst["candidate"], worst["reference"]) == ("cp=on", "cp=off")
    assert float(worst["ref"]) != float(worst["cand"])
    assert (worst["rtol"], worst["atol"]) == ("0.0001", "0.0001")
    assert "<untrusted>" in seen["base_news"]  # probe feedback is marked as data
    assert re.search(r"first mismatch at index \[\d+, \d+, \d+\]: reference \S+, candidate \S+",
                     seen["case_detail"]), seen["case_detail"]
    assert "rtol 0.0001, atol 0.0001" in seen["case_detail"]
    # The fix came from the file as read, not from the test's knowledge.
    assert seen["old_line"] == 'INPUT_PRECISION = "tf32"'
    assert "Edited kda/merge.py (+1 -1" in seen["edit_file"]
    assert "Syntax error" not in seen["edit_file"]

    base = Experiment.objects.get(pk=seen["base_experiment"])
    fixed = Experiment.objects.get(pk=seen["fixed_experiment"])
    assert base.probes == fixed.probes == ["cp-equivalence"]
    assert base.candidate_commit == base.baseline_commit == run.base_commit
    assert fixed.status == Experiment.Status.SUCCEEDED
    assert not [f for f in fixed.feedback["findings"] if f["severity"] == "fail"]
    assert [f for f in fixed.feedback["findings"] if f["kind"] == "fixed"]

    change = Change.objects.get()
    assert change.experiment_id == fixed.pk
    assert '+INPUT_PRECISION = "tf32x3"' in change.diff
    assert '-INPUT_PRECISION = "tf32"' in change.diff
    assert list(run.changes.all()) == [change]

    # Each step recorded its tool call with the arguments the model sent and an ok result.
    steps = list(Step.objects.filter(run=run).order_by("number"))
    calls = [c for s in steps for c in s.calls]
    assert [c["name"] for c in calls] == [
        "list_probes", "run_experiment", "case_detail", "search_code", "read_file",
        "edit_file", "show_diff", "run_experiment", "submit_change", "finish"]
    assert all(c["ok"] and not c["refusal"] and not c["malformed"] for c in calls), calls
    assert [c["arguments"] for c in calls] == [a for answer in agent.answered for _, a in answer]
    assert calls[5]["arguments"] == {"path": "kda/merge.py", "old_text": seen["old_line"],
                                     "new_text": 'INPUT_PRECISION = "tf32x3"'}
    assert steps[1].experiment_id == base.pk and steps[7].experiment_id == fixed.pk
    assert len(stub.requests) == len(steps) == 10
    no_key_sent(stub)


# --- a failing model endpoint ---------------------------------------------------------------

def look_then_finish(first: Turn) -> Script:
    turn = yield [call("list_files", path="kda", glob="*.py")]
    assert "kda/merge.py" in turn.result("list_files"), turn.result("list_files")
    yield [call("finish", summary="the endpoint answered again")]


def test_429_and_500s_are_waited_out_and_the_run_goes_on(
    stub: OpenAIStub, live_system: str, kda_goal: Goal, engineer: User,
) -> None:
    stub.push(rate_limited(1))
    for _ in range(3):
        stub.push(server_error(500))
    agent = ScriptedAgent(look_then_finish)
    agent.install(stub)

    run = run_start(goal=kda_goal, user=engineer)
    run = ended(run, stub)

    assert stub.errors == [], stub.errors
    assert run.status == AgentRun.Status.FINISHED, run.stop_reason
    assert "the endpoint answered again" in run.stop_reason
    assert run.step_count == 2 and run.provider_failing_since is None
    assert len(stub.requests) == 4 + 2
    seen = waits(run)
    # One request per step and no sleep in the worker: the 429 re-schedules the step after
    # its Retry-After, each 500 after a backoff doubling from 2 s.
    assert [(w["retry_in"], w["attempt"]) for w in seen] == [(1, 0), (2, 1), (4, 2), (8, 3)]
    assert "429" in seen[0]["reason"]
    assert all("500" in w["reason"] for w in seen[1:]), seen
    no_key_sent(stub)


@pytest.mark.parametrize("retry_seconds", ["3"])
def test_dropped_connections_past_the_retry_window_pause_the_run_and_resume_completes_it(
    stub: OpenAIStub, live_system: str, kda_goal: Goal, engineer: User,
) -> None:
    agent = ScriptedAgent(look_then_finish)
    agent.up = False  # every connection is closed without an answer
    agent.install(stub)

    run = run_start(goal=kda_goal, user=engineer)
    run = ended(run, stub)

    assert run.status == AgentRun.Status.PAUSED, run.stop_reason
    assert run.stop_reason.startswith("the model endpoint has failed for"), run.stop_reason
    assert f"LLM endpoint {stub.base_url}/chat/completions could not be reached" \
        in run.stop_reason
    assert run.stop_reason.endswith("Resume retries")
    assert not agent.turns
    # The model was never reached: no step is recorded, none of the step budget is spent.
    assert not Step.objects.filter(run=run).exists() and run.step_count == 0
    seen = waits(run)
    assert seen and all(set(w) == {"retry_in", "attempt", "reason"} for w in seen)
    # One request per step; each failure re-schedules the step, the backoff doubling from
    # 2 s and cut at the window's end; the failure after the window pauses the run.
    assert all("could not be reached" in w["reason"] for w in seen), seen
    assert [w["attempt"] for w in seen] == list(range(1, len(seen) + 1))
    assert seen[0]["retry_in"] == 2
    assert len(stub.requests) == len(seen) + 1

    agent.up = True
    asked_before = len(stub.requests)
    run = run_resume(run=run, user=engineer)
    run = ended(run, stub, ["succeeded", "failed", "finished", "cancelled"])

    assert stub.errors == [], stub.errors
    assert run.status == AgentRun.Status.FINISHED, run.stop_reason
    assert "the endpoint answered again" in run.stop_reason
    assert len(stub.requests) == asked_before + 2 and len(agent.turns) == 2
    assert list(Step.objects.filter(run=run).order_by("number").values_list("tool", flat=True)) \
        == ["list_files", "finish"]
    no_key_sent(stub)
