"""The experiment tools (agents/tools/experiments.py) on real experiments: a target whose
probes compare variants case by case, trace two threads, crash on the candidate only or on
both sides; experiments run in-process through the sandbox, and the tools are called as the
model calls them, through tool_call.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from agents.models import AgentRun
from agents.policies.shared import boundary
from agents.tools import REGISTRY, ToolContext, ToolResult, tool_call
from infraops import gitops
from infraops.experiments.services import experiment_execute, experiment_request
from infraops.models import Experiment, Goal, Target
from infraops.services.targets import target_register
from tests.conftest import make_origin, members_of_new_target
from tests.factories import AgentRunFactory, ExperimentFactory, GoalFactory

TOOLS = ("probe_error", "list_probes", "compare_experiments", "case_detail", "span_summary")

MANIFEST = """
[[probe]]
name = "broken"
layer = "correctness"
command = "python3 -S bench/broken.py"
cost = 9
covers = ["lib/**"]
warmup = 0
files = ["bench/broken.py"]

[[probe]]
name = "squares"
layer = "correctness"
command = "python3 -S bench/squares.py"
cost = 1
covers = ["lib/**"]
variants = {dtype = ["fp32", "fp16"]}
compare = {reference = {dtype = "fp32"}, candidate = {dtype = "fp16"}, rtol = 1e-3}
warmup = 0
files = ["bench/squares.py"]

[[probe]]
name = "pipeline"
layer = "behaviour"
command = "python3 -S bench/pipeline.py"
cost = 2
covers = ["lib/**"]
metrics = ["step_ms"]
repeat = 5
warmup = 0
files = ["bench/pipeline.py"]

[[probe]]
name = "fragile"
layer = "correctness"
command = "python3 -S bench/fragile.py"
cost = 3
covers = ["lib/**"]
warmup = 0
files = ["bench/fragile.py"]
"""

SQUARES = """
import json, os, sys
sys.path.insert(0, ".")
from lib.calc import squares
out = os.path.join(os.environ["INFRAOPS_OUT"], "outputs")
os.makedirs(out, exist_ok=True)
for case, n in (("small", 4), ("large", 8)):
    result = squares([i * 0.5 for i in range(n)], os.environ["DTYPE"])
    json.dump(result, open(os.path.join(out, case + ".json"), "w"))
"""

# compute on thread main, then transfer on thread worker: they never overlap.
PIPELINE = """
import json, os, sys
sys.path.insert(0, ".")
from lib.calc import TRANSFER_MS
out = os.environ["INFRAOPS_OUT"]
events = [{"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "main"}},
          {"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args": {"name": "worker"}}]
t = 0
for step in range(4):
    events.append({"ph": "X", "name": "compute", "pid": 1, "tid": 1, "ts": t, "dur": 25000})
    events.append({"ph": "X", "name": "transfer", "pid": 1, "tid": 2, "ts": t + 25000,
                   "dur": TRANSFER_MS * 1000})
    t += 25000 + TRANSFER_MS * 1000
json.dump({"traceEvents": events}, open(out + "/trace.json", "w"))
ms = 20 + TRANSFER_MS + 0.01 * int(os.environ["INFRAOPS_REPEAT"])
open(out + "/metrics.jsonl", "w").write(json.dumps({"name": "step_ms", "value": ms}) + "\\n")
"""

FRAGILE = """
import sys
sys.path.insert(0, ".")
from lib.calc import FRAGILE
if FRAGILE:
    sys.stderr.write("noise from the probe\\n" * 400)
    sys.stderr.write("ValueError: the last line of the crash\\n")
    sys.exit(3)
"""

BROKEN = """
import sys
sys.stderr.write("always broken\\n")
sys.exit(2)
"""

HONEST = """
TRANSFER_MS = 10
FRAGILE = False


def squares(values, dtype):
    return [v * v for v in values]
"""

# fp16 goes wrong at index 3 of the large case; transfer takes three times as long; fragile
# crashes.
BUGGED = """
TRANSFER_MS = 30
FRAGILE = True


def squares(values, dtype):
    result = [v * v for v in values]
    if dtype == "fp16" and len(values) == 8:
        result[3] += 0.5
    return result
"""


@pytest.fixture
def lab(db: None, tmp_path: Path) -> Target:
    source = tmp_path / "lab-src"
    (source / "bench").mkdir(parents=True)
    (source / "lib").mkdir()
    (source / "infraops.toml").write_text(MANIFEST)
    for name, text in (("squares", SQUARES), ("pipeline", PIPELINE), ("fragile", FRAGILE),
                       ("broken", BROKEN)):
        (source / "bench" / f"{name}.py").write_text(text)
    (source / "lib" / "__init__.py").write_text("")
    (source / "lib" / "calc.py").write_text(HONEST)
    return members_of_new_target(target_register(
        name="lab", repo_url=str(make_origin(tmp_path, source, "lab.git")), base_branch="main"))


@pytest.fixture
def run(lab: Target, engineer: User) -> AgentRun:
    goal = GoalFactory.create(
        target=lab, name="faster", probe="pipeline", metric="step_ms", policy=Goal.Policy.LLM,
        owner=engineer, boundary__editable_paths="lib/**",
        criteria=[{"kind": "relative", "probe": "pipeline", "metric": "step_ms",
                   "comparison": "<=", "value": 0.05, "name": "step within 5%"}],
        snapshot_by=engineer)
    # Made directly: run_start would queue its first step through the broker. Target, policy
    # ("llm"), base commit and manifest hash are the goal's and the lab's.
    return AgentRunFactory.create(goal=goal, started_by=engineer)


@pytest.fixture
def ctx(run: AgentRun, tmp_path: Path) -> ToolContext:
    return ToolContext(worktree=tmp_path, policy=boundary(run), base_commit=run.base_commit,
                       run=run)


def commit(target: Target, tmp_path: Path, calc: str, name: str) -> str:
    tree = tmp_path / f"tree-{name}"
    gitops.worktree_add(target.clone_path, tree, target.manifest_commit)
    (tree / "lib" / "calc.py").write_text(calc)
    sha = gitops.commit_all(tree, name, author_name="t", author_email="t@t")
    gitops.worktree_remove(target.clone_path, tree)
    assert sha is not None
    return sha


@pytest.fixture
def experiment_of(run: AgentRun, lab: Target, tmp_path: Path,
                  django_capture_on_commit_callbacks: Callable[..., Any]
                  ) -> Callable[..., Experiment]:
    """Run one of the run's experiments to its end: the honest or the bugged candidate."""

    def make(calc: str, probes: list[str], **kwargs: Any) -> Experiment:
        candidate = commit(lab, tmp_path, calc, f"c{Experiment.objects.count()}")
        with django_capture_on_commit_callbacks(execute=False):
            experiment = experiment_request(
                target=lab, candidate_commit=candidate, baseline_commit=run.base_commit,
                probes=probes, criteria=run.goal_version.spec["criteria"], **kwargs)
        run.experiments.add(experiment)
        result = experiment_execute(experiment_id=experiment.pk, worker="tools:1")
        assert result is not None
        return result

    return make


def call(ctx: ToolContext, name: str, **arguments: Any) -> ToolResult:
    return tool_call(ctx, name, json.dumps(arguments))


def error_of(result: ToolResult) -> dict[str, Any]:
    assert not result.ok, result.content
    payload: dict[str, Any] = json.loads(result.content)
    return payload


# --------------------------------------------------------------------------- registry


def test_the_tools_are_run_tools_and_those_with_probe_text_are_untrusted() -> None:
    for name in TOOLS:
        entry = REGISTRY[name]
        assert entry.needs_run and entry.untrusted, name
        assert entry.parameters["additionalProperties"] is False
    assert REGISTRY["span_summary"].parameters["required"] == ["experiment_id", "span"]
    assert REGISTRY["list_probes"].parameters["properties"] == {}


def test_without_a_run_the_tools_answer_a_structured_error(tmp_path: Path, ctx: ToolContext
                                                           ) -> None:
    bare = ToolContext(worktree=tmp_path, policy=ctx.policy, base_commit=ctx.base_commit)

    assert "needs a run" in error_of(call(bare, "list_probes"))["error"]


# --------------------------------------------------------------------------- list_probes


def test_list_probes_lists_the_pinned_probes_cheapest_first_with_their_cells(
    ctx: ToolContext,
) -> None:
    result = call(ctx, "list_probes")

    assert result.ok
    assert [p["name"] for p in result.data["probes"]] == ["squares", "pipeline", "fragile",
                                                          "broken"]
    squares = result.data["probes"][0]
    assert squares == {"name": "squares", "layer": "correctness", "cost": 1,
                       "covers": ["lib/**"], "variants": ["dtype=fp32", "dtype=fp16"],
                       "requires": [], "metrics": []}
    assert result.data["probes"][1]["metrics"] == ["step_ms"]
    assert "variant cells (2): [dtype=fp32], [dtype=fp16]" in result.content
    assert "compare: [dtype=fp16] must match [dtype=fp32] (rtol 0.001" in result.content
    assert "- pipeline (behaviour, cost 2): covers lib/**; metrics step_ms; repeat 5" in (
        result.content)
    assert result.content.index("- squares") < result.content.index("- broken")


def test_an_argument_list_probes_does_not_take_is_refused(ctx: ToolContext) -> None:
    error = error_of(call(ctx, "list_probes", probe="squares"))

    assert error["field"] == "probe"
    assert "unknown field `probe`" in error["error"]


# --------------------------------------------------------------------------- probe_error


def test_probe_error_shows_a_candidate_only_crash_with_a_bounded_stderr_tail(
    ctx: ToolContext, experiment_of: Callable[..., Experiment],
) -> None:
    experiment = experiment_of(BUGGED, ["fragile", "broken"], stop_on_failure=False)

    result = call(ctx, "probe_error", experiment_id=experiment.pk, probe="fragile")

    assert result.ok, result.content
    assert ctx.effects.experiment == experiment.pk
    assert result.data | {"execution": 0} == {
        "experiment": experiment.pk, "failed": 1, "execution": 0, "probe": "fragile",
        "side": "candidate", "variant": "", "repeat": 0, "exit_code": 3, "reason": "exit",
        "sides": "candidate only"}
    assert "The first: fragile candidate [default] repeat 0." in result.content
    assert "Exit: exit status 3, reason exit." in result.content
    assert "candidate only: the baseline ran fragile [default] 1 time" in result.content
    tail = result.content.split("Stderr (the end):\n", 1)[1].split("\nReproduce:")[0]
    assert tail.rstrip().endswith("ValueError: the last line of the crash")
    assert "earlier characters not shown" in tail
    assert len(tail) <= 4100  # about 4000 characters of the 8000 it wrote
    assert "Reproduce: git checkout " + experiment.candidate_commit[:12] in result.content


def test_probe_error_says_when_the_baseline_fails_too(
    ctx: ToolContext, experiment_of: Callable[..., Experiment],
) -> None:
    experiment = experiment_of(BUGGED, ["fragile", "broken"], stop_on_failure=False)

    first = call(ctx, "probe_error", experiment_id=experiment.pk)
    broken = call(ctx, "probe_error", experiment_id=experiment.pk, probe="broken")

    # Unnamed: the first failure of the attempt, and the others one line each.
    assert first.data["probe"] == "fragile" and first.data["failed"] == 2
    assert "Also failed:\n- broken baseline [default] repeat 0: exit status 2" in first.content
    assert broken.data["side"] == "baseline" and broken.data["sides"] == "baseline too"
    assert "the baseline fails: not the change's doing" in broken.content
    assert "always broken" in broken.content


def test_probe_error_says_when_no_probe_failed(
    ctx: ToolContext, experiment_of: Callable[..., Experiment],
) -> None:
    experiment = experiment_of(HONEST.replace("TRANSFER_MS = 10", "TRANSFER_MS = 11"),
                               ["fragile"])

    result = call(ctx, "probe_error", experiment_id=experiment.pk)

    assert result.ok and result.data["failed"] == 0
    assert result.content == f"No probe failed in experiment {experiment.pk}; it succeeded."


def test_unknown_experiments_and_probes_are_structured_errors_naming_what_exists(
    ctx: ToolContext, experiment_of: Callable[..., Experiment], lab: Target,
) -> None:
    experiment = experiment_of(BUGGED, ["fragile"])
    # Another run's experiment is not this run's to read.
    stranger = experiment_request(target=lab, candidate_commit=experiment.candidate_commit,
                                  baseline_commit=lab.manifest_commit, probes=["broken"])

    for pk in (experiment.pk + 1000, stranger.pk):
        error = error_of(call(ctx, "probe_error", experiment_id=pk))
        assert error["error"] == f"no experiment {pk} in this run"
        assert error["hint"] == f"This run's experiments: {experiment.pk}."
    error = error_of(call(ctx, "probe_error", experiment_id=experiment.pk, probe="nope"))
    assert error["error"] == f"experiment {experiment.pk} has no probe 'nope'"
    assert error["hint"] == "Its probes: fragile."


# --------------------------------------------------------------------------- compare_experiments


def test_compare_experiments_puts_medians_ratios_verdicts_and_criteria_side_by_side(
    ctx: ToolContext, experiment_of: Callable[..., Experiment],
) -> None:
    honest = experiment_of(HONEST.replace("FRAGILE = False", "FRAGILE = 0"), ["pipeline"])
    bugged = experiment_of(BUGGED, ["pipeline"])

    result = call(ctx, "compare_experiments", first_id=honest.pk, second_id=bugged.pk)

    assert result.ok, result.content
    assert ctx.effects.experiment == bugged.pk
    assert f"#{honest.pk}: succeeded, candidate {honest.candidate_commit[:10]}" in result.content
    [row] = [line for line in result.content.splitlines() if line.startswith("- pipeline")]
    assert row.startswith(f"- pipeline.step_ms: #{honest.pk} 30.02 (x1.000, ")
    assert f"| #{bugged.pk} 50.02 (x1.666, regressed)  <- verdict differs" in row
    assert result.data["verdicts_differ"][0].startswith("pipeline.step_ms: ")
    assert result.data["verdicts_differ"][0].endswith(" -> regressed")
    [criterion] = [line for line in result.content.splitlines() if "step within 5%" in line]
    assert criterion.startswith(f"- step within 5%: #{honest.pk} passed")
    assert f"#{bugged.pk} failed (+66.62%)" in criterion


def test_compare_experiments_needs_two_of_the_runs_experiments(
    ctx: ToolContext, experiment_of: Callable[..., Experiment],
) -> None:
    experiment = experiment_of(BUGGED, ["fragile"])

    same = error_of(call(ctx, "compare_experiments", first_id=experiment.pk,
                         second_id=experiment.pk))
    missing = error_of(call(ctx, "compare_experiments", first_id=experiment.pk, second_id=99999))

    assert same["error"] == "both ids name the same experiment"
    assert missing["error"] == "no experiment 99999 in this run"


# --------------------------------------------------------------------------- case_detail


def test_case_detail_gives_the_first_mismatch_of_each_failing_case(
    ctx: ToolContext, experiment_of: Callable[..., Experiment],
) -> None:
    experiment = experiment_of(BUGGED, ["squares"])

    result = call(ctx, "case_detail", experiment_id=experiment.pk, probe="squares")

    assert result.ok, result.content
    assert ctx.effects.experiment == experiment.pk
    assert result.data["cases"] == ["large", "small"]
    lines = result.content.splitlines()
    rule = lines.index("[dtype=fp16] vs [dtype=fp32] (candidate) (rtol 0.001, atol 1e-08):")
    assert lines[rule + 1] == ("  case large: FAIL (mismatch); max abs error 0.5, max rel error "
                               "0.2222")
    assert lines[rule + 2] == ("    1 elements outside tolerance; first mismatch at index [3]: "
                               "reference 2.25, candidate 2.75")
    assert lines[rule + 3] == "  pass (within tolerance): small; name a case for its errors"
    # Against the baseline too, and the baseline's own rule holds.
    assert "candidate vs baseline [dtype=fp16] (rtol 0.001, atol 1e-08):" in lines
    assert "candidate vs baseline [dtype=fp32] (rtol 0.001, atol 1e-08):" in lines


def test_case_detail_of_a_named_passing_case_recomputes_its_errors(
    ctx: ToolContext, experiment_of: Callable[..., Experiment],
) -> None:
    experiment = experiment_of(BUGGED, ["squares"])

    result = call(ctx, "case_detail", experiment_id=experiment.pk, probe="squares",
                  case="small")

    assert result.ok, result.content
    assert result.data["case"] == "small"
    passing = [line for line in result.content.splitlines() if line.startswith("  case small")]
    assert passing and all(line.startswith("  case small: pass; max abs error 0, max rel error 0")
                           for line in passing)
    assert "FAIL" not in result.content


def test_case_detail_names_the_cases_and_the_probes_that_have_them(
    ctx: ToolContext, experiment_of: Callable[..., Experiment],
) -> None:
    experiment = experiment_of(BUGGED, ["squares", "pipeline"])

    unknown = error_of(call(ctx, "case_detail", experiment_id=experiment.pk, probe="squares",
                            case="huge"))
    no_cases = error_of(call(ctx, "case_detail", experiment_id=experiment.pk, probe="pipeline"))

    assert unknown["error"] == f"squares has no case 'huge' in experiment {experiment.pk}"
    assert unknown["hint"] == "Its cases: large, small."
    assert no_cases["error"] == f"no per-case comparison of pipeline in experiment {experiment.pk}"
    assert no_cases["hint"] == "Probes with case comparisons in this experiment: squares."


# --------------------------------------------------------------------------- span_summary


def test_span_summary_gives_both_sides_stats_overlap_and_idle_time(
    ctx: ToolContext, experiment_of: Callable[..., Experiment],
) -> None:
    experiment = experiment_of(BUGGED, ["pipeline"])

    result = call(ctx, "span_summary", experiment_id=experiment.pk, span="transfer")

    assert result.ok, result.content
    assert ctx.effects.experiment == experiment.pk
    lines = result.content.splitlines()
    assert "pipeline [default]:" in lines
    assert ("  candidate: 4 spans, total 120 ms, mean 30 ms (calls by thread: worker 4)"
            in lines)
    assert "  baseline: 4 spans, total 40 ms, mean 10 ms (calls by thread: worker 4)" in lines
    assert "  candidate vs baseline: total x3.000, mean x3.000, count 4 -> 4" in lines
    assert "    overlapped by: compute 0.0%" in lines
    assert any(line.startswith("    idle: transfer sat idle") for line in lines)
    assert "Findings about it:" in lines  # the feedback's own: it grew, it never overlaps


def test_span_summary_takes_a_glob_and_names_the_spans_it_has(
    ctx: ToolContext, experiment_of: Callable[..., Experiment],
) -> None:
    experiment = experiment_of(BUGGED, ["pipeline", "squares"])

    globbed = call(ctx, "span_summary", experiment_id=experiment.pk, span="trans*",
                   probe="pipeline")
    unknown = error_of(call(ctx, "span_summary", experiment_id=experiment.pk, span="gil_wait"))
    untraced = error_of(call(ctx, "span_summary", experiment_id=experiment.pk, span="compute",
                             probe="squares"))

    assert globbed.ok and "  candidate: 4 spans, total 120 ms" in globbed.content
    assert unknown["error"] == f"no span 'gil_wait' in the traces of experiment {experiment.pk}"
    # compute: 100 ms a side; transfer: 40 ms on the baseline, 120 ms on the candidate.
    assert unknown["hint"] == "Spans there, longest first: compute, transfer."
    assert untraced["error"] == (f"no trace.json stored for squares in experiment "
                                 f"{experiment.pk}")
    assert untraced["hint"] == "Probes with traces here: pipeline."


def test_compare_experiments_names_the_correctness_verdicts_that_differ(
    run: AgentRun, ctx: ToolContext,
) -> None:
    failing = [{"layer": "correctness", "kind": "output-mismatch", "severity": "fail",
                "title": f"squares [dtype=fp16] case c{n} mismatch", "detail": "max abs 1.0",
                "evidence": {}} for n in range(5)]
    broken, fixed = (ExperimentFactory.create(
        target=run.target, status=Experiment.Status.SUCCEEDED, feedback={"findings": found})
        for found in (failing, []))
    run.experiments.add(broken, fixed)

    result = call(ctx, "compare_experiments", first_id=broken.pk, second_id=fixed.pk)

    assert result.ok, result.content
    assert "Verdicts that differ: none" not in result.content
    assert len(result.data["verdicts_differ"]) == 5
    assert (f"squares [dtype=fp16] case c0 mismatch: fails in #{broken.pk}, not in "
            f"#{fixed.pk}") in result.content


def test_compare_experiments_tells_apart_the_cases_of_one_cause(
    run: AgentRun, ctx: ToolContext,
) -> None:
    # One finding per cause (infraops.feedback.findings.by_root_cause) stands for its cases.
    def cause(cases: list[str]) -> dict[str, Any]:
        title = (f"squares [dtype=fp16] case {cases[0]} mismatch" if len(cases) == 1 else
                 f"squares [dtype=fp16] cases {', '.join(cases)} mismatch")
        return {"layer": "correctness", "kind": "output-mismatch", "severity": "fail",
                "title": title, "detail": "max abs 1.0",
                "evidence": {"case": cases[0], "cases": cases}}

    everywhere, one_left = (ExperimentFactory.create(
        target=run.target, status=Experiment.Status.SUCCEEDED, feedback={"findings": [found]})
        for found in (cause(["c2", "c1", "c0"]), cause(["c2"])))
    run.experiments.add(everywhere, one_left)

    result = call(ctx, "compare_experiments", first_id=everywhere.pk, second_id=one_left.pk)

    assert result.data["verdicts_differ"] == [
        f"squares [dtype=fp16] case {case} mismatch: fails in #{everywhere.pk}, not in "
        f"#{one_left.pk}" for case in ("c0", "c1")]
