"""The demo's scripted model on a target whose probe has no compare rule: examples/fla-cp,
flash-linear-attention's context-parallel merge measured against float64 on a GPU, judged by
its goal's criterion. The model is driven turn by turn through its reply function with the
conversation agents/policies/llm.py builds: tool results worded as the tools word them, and
the experiment news built by the real analysis from samples like the probe's."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

import pytest

from agents.policies.llm import untrusted
from agents.scripted import demo
from agents.scripted.demo import SETTING, DemoModel
from agents.scripted.endpoint import CHAT_PATH, ReceivedRequest
from agents.tools import REGISTRY
from infraops.experiments.analysis import experiment_feedback
from infraops.feedback.samples import SampleRow
from infraops.manifest import parse_manifest
from infraops.models import AcceptanceCriterion, Experiment, ProbeExecution

pytestmark = pytest.mark.django_db  # the analysis looks up the executions' labels

PROBE = "cp-merge"
CRITERION = "max relative error <= 1e-3 at every length"
MANIFEST = """
[[probe]]
name = "cp-merge"
layer = "performance"
command = "python3 bench/cp_merge.py"
cost = 6
covers = ["fla/ops/cp/**"]
repeat = 3
metrics = ["rel_error", "merge_us", "max_rel_error"]
requires = ["gpu"]
"""
PATH = "fla/ops/cp/chunk_merge.py"
TF32_LINE = "CP_DOT_PRECISION = tl.constexpr('ieee' if IS_NPU else 'tf32')"
TF32X3_LINE = "CP_DOT_PRECISION = tl.constexpr('ieee' if IS_NPU else 'tf32x3')"
# The merge's relative error per case (the number of merged chunks): TF32 loses about 1e-5
# per merged chunk, and tf32x3 keeps it near float32's rounding.
TF32 = {"len-16": 2.1e-4, "len-64": 8.3e-4, "len-256": 3.4e-3, "len-1024": 1.37e-2}
TF32X3 = {"len-16": 3.1e-7, "len-64": 5.2e-7, "len-256": 9.8e-7, "len-1024": 2.2e-6}

PROBES = """1 probes, cheapest first:
- cp-merge (performance, cost 6): covers fla/ops/cp/**; metrics rel_error, merge_us, \
max_rel_error; repeat 3 (up to 6 more when undecided), warm-up 0; requires gpu
  no variants (one cell)"""
SEARCHED = f"""1 matches for {SETTING!r} in 14 files:
{PATH}:15: {TF32_LINE}"""
# The base's first lines of the file, numbered as read_file numbers them.
SOURCE = [
    "# Copyright (c) 2023-2026, Songlin Yang, Yu Zhang, Zhiyuan Li", "#",
    "# This source code is licensed under the MIT license found in the",
    "# LICENSE file in the root directory of this source tree.",
    "# For a list of all contributors, visit:",
    "#   https://github.com/fla-org/flash-linear-attention/graphs/contributors", "",
    "import torch", "import triton", "import triton.language as tl", "",
    "from fla.ops.cp.context import _check_cp_device",
    "from fla.utils import IS_NPU, autotune_cache_kwargs", "", TF32_LINE, "", "",
    "@triton.jit", "def chunk_cp_merge_state(", "    hm,", "    b_h,", "    o_k,", "    o_v,",
    "    K: tl.constexpr,", "    V: tl.constexpr,", "    BK: tl.constexpr,",
    "    BV: tl.constexpr,", "    STATE_V_FIRST: tl.constexpr,", "):",
    '    """Apply one [h_local | M] summary to a boundary state.', "",
    "    K-first states use M @ h + h_local; V-first states use h @ M.T + h_local.T.",
    "    The summary itself always keeps the [K, V+K] layout.", '    """',
    "    m_k, m_v = o_k < K, o_v < V"]
READ = "\n".join([f"{PATH}, lines 1-35 of 258:",
                  *(f"{number:6}\t{line}" for number, line in enumerate(SOURCE, 1))])
EDITED = f"""Edited {PATH} (+1 -1 lines; the run's diff is now 2 of 10 changed lines).
--- a/{PATH}
+++ b/{PATH}
@@ -15 +15 @@
-{TF32_LINE}
+{TF32X3_LINE}"""


def news(experiment: int, candidate: dict[str, float], base: dict[str, float] = TF32) -> str:
    """The news of a finished cp-merge experiment, as the run words it (`_news` in
    agents/policies/llm.py) around the feedback the real analysis gives samples like the
    probe's: three executions a side, rel_error and merge_us per case, max_rel_error."""
    criterion = AcceptanceCriterion(kind="threshold", probe=PROBE, metric="max_rel_error",
                                    comparison="<=", value=1e-3, name=CRITERION)
    trial = Experiment(pk=experiment, probes=[PROBE], variants={},
                       criteria=[criterion.as_spec()], margin=0.1,
                       margin_metric=f"{PROBE}.max_rel_error")
    executions: list[ProbeExecution] = []
    rows: list[SampleRow] = []
    for side, errors in (("baseline", base), ("candidate", candidate)):
        for repeat, jitter in enumerate((1.0, 1.04, 0.97)):
            execution = ProbeExecution(pk=len(executions) + 1, probe=PROBE, side=side,
                                       repeat_index=repeat, exit_code=0, reason="ok")
            executions.append(execution)
            rows += [SampleRow(PROBE, side, "", metric, value, unit, case, execution.pk)
                     for case, error in errors.items()
                     for metric, value, unit in (("rel_error", error, ""),
                                                 ("merge_us", 40 * jitter, "us"))]
            rows.append(SampleRow(PROBE, side, "", "max_rel_error", max(errors.values()),
                                  execution=execution.pk))
    feedback = experiment_feedback(trial, parse_manifest(MANIFEST), executions, rows)
    return f"Experiment {experiment} succeeded. Its feedback:\n{untrusted(feedback['agent_text'])}"


Call = tuple[str, dict[str, Any]]


class Conversation:
    """The run's side of the conversation with DemoModel, as agents/policies/llm.py builds
    it: the system prompt, the goal message with the budgets left and the state, then each
    step's news, the model's calls and their results."""

    def __init__(self) -> None:
        self.model = DemoModel()
        self.goal: dict[str, Any] = {
            "goal": {"name": "Numerics: the CP merge matches float64", "probe": PROBE,
                     "metric": "max_rel_error", "direction": "minimize",
                     "relative_target": None, "absolute_target": None},
            "criteria": [f"{PROBE}.max_rel_error <= 0.001"],
            "editable_paths": ["fla/ops/cp/**"], "protected_paths": [],
            "budgets_left": {"steps": 15, "experiments": 4, "tokens": 200_000},
            "manifest": {"probes": [{"name": PROBE, "layer": "performance", "cost": 6,
                                     "covers": ["fla/ops/cp/**"],
                                     "metrics": ["rel_error", "merge_us", "max_rel_error"]}],
                         "knobs": []}}
        self.history: list[dict[str, Any]] = []
        self.calls: list[Call] = []  # every call the model made, in order
        self.assistant: dict[str, Any] | None = None

    def step(self, results: dict[str, str] | None = None, news: Sequence[str] = ()
             ) -> list[Call]:
        """Answer the previous step's calls with `results` (by tool name), deliver `news`,
        and send the request: the calls the model answers with."""
        if self.assistant is not None:
            self.history.append(self.assistant)
            for made in self.assistant["tool_calls"]:
                name = made["function"]["name"]
                text = (results or {})[name]
                self.history.append({"role": "tool", "tool_call_id": made["id"],
                                     "content": untrusted(text) if REGISTRY[name].untrusted
                                     else text})
        self.history += [{"role": "user", "content": text} for text in news]
        self.goal["budgets_left"]["steps"] -= 1
        body = {"model": "infraops-demo", "messages": [
            {"role": "system", "content": "You improve the code toward the goal."},
            {"role": "user", "content": json.dumps(self.goal, indent=1)},
            {"role": "user", "content": "Your hypothesis ledger:\n(empty)"}, *self.history]}
        raw = json.dumps(body).encode()
        reply = self.model(ReceivedRequest("POST", CHAT_PATH, {}, raw, body))
        assert isinstance(reply.body, dict), reply
        self.assistant = reply.body["choices"][0]["message"]
        made = [(c["function"]["name"], json.loads(c["function"]["arguments"]))
                for c in self.assistant["tool_calls"]]
        self.calls += made
        return made

    def queued(self, experiment: int) -> str:
        return (f"Experiment {experiment} queued (probes: {PROBE}); its feedback arrives at "
                "your next step.")


def names(calls: Sequence[Call]) -> list[str]:
    return [name for name, _ in calls]


def test_it_raises_the_merge_precision_from_the_failed_criterion_and_cites_the_errors(
        ) -> None:
    talk = Conversation()
    assert names(talk.step()) == ["list_probes"]
    [(_, run)] = talk.step({"list_probes": PROBES})
    assert run["probes"] == [PROBE] and "variants" not in run
    [(_, search)] = talk.step({"run_experiment": talk.queued(41)}, [news(41, TF32)])
    assert search["path_glob"] == "fla/ops/cp/**"
    [(_, read)] = talk.step({"search_code": SEARCHED})
    assert (read["path"], read["start_line"], read["end_line"]) == (PATH, 1, 35)
    [(_, edit)] = talk.step({"read_file": READ})

    assert edit == {"path": PATH, "old_text": TF32_LINE, "new_text": TF32X3_LINE}
    assert names(talk.step({"edit_file": EDITED})) == ["run_experiment"]
    [(_, submit)] = talk.step({"run_experiment": talk.queued(42)}, [news(42, TF32X3)])
    assert (submit["title"], submit["experiment_id"]) == (
        "CP_DOT_PRECISION in tf32x3, not tf32", 42)
    # It cites what it measured: the error growing with the length, the largest at len-1024,
    # and the criterion the unchanged code failed, with its verdict.
    hypothesis = submit["hypothesis"]
    assert ("the error grew with the length (rel_error 0.00021 at len-16, rel_error 0.00083 at "
            "len-64, rel_error 0.0034 at len-256, rel_error 0.0137 at len-1024)") in hypothesis
    assert (f"criterion '{CRITERION}' failed: {PROBE}.max_rel_error <= 0.001: candidate "
            "median 0.0137") in hypothesis
    assert "rel_error 2.2e-06 at len-1024" in hypothesis
    [(_, finish)] = talk.step({"submit_change": "Change 7 submitted (pending review)."})
    assert names(talk.calls) == ["list_probes", "run_experiment", "search_code", "read_file",
                                 "edit_file", "run_experiment", "submit_change", "finish"]
    assert finish["summary"] == (f"Fixed criterion '{CRITERION}': CP_DOT_PRECISION tf32 -> "
                                 f"tf32x3 in {PATH}; the change waits for review.")


def test_the_hypothesis_says_the_error_grew_only_where_the_measurements_show_it() -> None:
    """On the real merge (the H200 and H100 runs of examples/fla-cp) TF32's error is flat in
    the length: the agent says so instead of the growth its hypothesis expected."""
    flat = [("len-16", "rel_error", "0.0009785"), ("len-64", "rel_error", "0.0007815"),
            ("len-256", "rel_error", "0.0007808"), ("len-1024", "rel_error", "0.001119")]
    growing = [("len-16", "rel_error", "0.00021"), ("len-1024", "rel_error", "0.0137")]
    said = {name: demo._hypothesis("CP_DOT_PRECISION", PATH, demo.Baseline(
        1, CRITERION, "misses", errors), 2, "nothing failed") for name, errors in
        (("flat", flat), ("growing", growing), ("none", []))}

    assert "the error did not grow with the length (rel_error 0.0009785 at len-16" in said["flat"]
    assert "grew" not in said["flat"] and "grows" not in said["flat"]
    assert "so the error grows with the length" in said["growing"]
    assert "the error grew with the length (rel_error 0.00021 at len-16" in said["growing"]
    assert "grow" not in said["none"]


def test_the_search_pattern_finds_both_targets_settings_and_no_indented_one() -> None:
    talk = Conversation()
    talk.step()
    talk.step({"list_probes": PROBES})
    [(_, search)] = talk.step({"run_experiment": talk.queued(41)}, [news(41, TF32)])
    pattern = re.compile(search["pattern"])

    assert pattern.search(TF32_LINE) and pattern.search('INPUT_PRECISION = "tf32"')
    assert not pattern.search(TF32X3_LINE)
    assert not pattern.search("    SOLVE_TRIL_DOT_PRECISION = tl.constexpr('tf32')")


def test_it_finishes_without_an_edit_when_the_unchanged_code_meets_the_criterion() -> None:
    talk = Conversation()
    talk.step()
    talk.step({"list_probes": PROBES})
    [(name, finish)] = talk.step({"run_experiment": talk.queued(41)},
                                 [news(41, TF32X3, base=TF32X3)])

    assert name == "finish" and names(talk.calls) == ["list_probes", "run_experiment", "finish"]
    assert finish["summary"] == (f"The unchanged code meets its criteria on {PROBE} "
                                 f"(experiment 41: criterion '{CRITERION}' passed): nothing "
                                 "to fix.")


@pytest.mark.parametrize("searched, found", [
    ("0 matches for '...' in 14 files:", "found 0"),
    (f"{SEARCHED}\nfla/ops/cp/chunk_fwd.py:12: CP_FWD_PRECISION = 'tf32'", "found 2"),
], ids=["none", "two"])
def test_it_finishes_with_the_reason_when_the_search_does_not_find_one_setting(
        searched: str, found: str) -> None:
    talk = Conversation()
    talk.step()
    talk.step({"list_probes": PROBES})
    talk.step({"run_experiment": talk.queued(41)}, [news(41, TF32)])
    [(name, finish)] = talk.step({"search_code": searched})

    assert name == "finish" and "edit_file" not in names(talk.calls)
    assert finish["summary"].startswith("The demo agent stopped: expected one precision "
                                        f"setting naming tf32, {found}")


def test_it_does_not_submit_when_the_criterion_still_fails_after_the_edit() -> None:
    talk = Conversation()
    talk.step()
    talk.step({"list_probes": PROBES})
    talk.step({"run_experiment": talk.queued(41)}, [news(41, TF32)])
    talk.step({"search_code": SEARCHED})
    talk.step({"read_file": READ})
    talk.step({"edit_file": EDITED})
    [(name, finish)] = talk.step({"run_experiment": talk.queued(42)}, [news(42, TF32)])

    assert name == "finish" and "submit_change" not in names(talk.calls)
    assert finish["summary"].startswith("tf32x3 did not fix it: Experiment 42 succeeded.")
    assert f"criterion '{CRITERION}' failed" in finish["summary"]
