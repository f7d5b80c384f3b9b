"""The demo's model: a scripted agent that fixes a merge's precision problem (case 1 of
docs/product.md) from the feedback alone, served as an OpenAI-compatible endpoint by
`manage.py demo_llm` (and `standalone --demo-llm`), so a user without an API key watches the
LLM loop work. It knows two ways to see the problem, chosen by what list_probes shows:

- a probe with a compare rule (the demo target, examples/demo-kernels): it runs that probe on
  the unchanged code, reads which case diverges and its detail, searches the code for the
  merge's precision, raises it, checks, and submits the change;
- otherwise the goal's own probe and criteria (examples/fla-cp, a performance probe measuring
  the merge's error against float64): it runs the goal's probe on the unchanged code, reads
  which criterion failed and the error per case, searches for a module-level precision
  setting that names TF32 in quotes, makes it tf32x3, checks that the criterion now passes,
  and submits the change citing the errors it measured; when nothing fails, it says so.

Every decision comes from what the run sent it (the goal message, tool results and
experiment news), as a model's would; no file name is known in advance. When the run sends
something it does not expect, it finishes and says what. Each conversation (the goal message
that opens it) gets an agent of its own.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import threading
from dataclasses import dataclass
from typing import Any

from agents.scripted.agent import Script, ScriptedAgent, Turn, call
from agents.scripted.endpoint import ReceivedRequest, StubReply

MODEL = "infraops-demo"
PRECISION = re.compile(r'^\s*\d+\t(INPUT_PRECISION = "(\w+)")$', re.M)
# A module-level setting of a precision that names TF32 in quotes, as both targets spell it:
# `INPUT_PRECISION = "tf32"` and `CP_DOT_PRECISION = tl.constexpr('ieee' if IS_NPU else 'tf32')`.
# Indented ones are left out: in flash-linear-attention they are the triangular solves' own
# choices under an `if`, not the merge's.
SETTING = r"""^\w*PRECISION\s*=.*['"]tf32['"]"""
QUOTED_TF32 = re.compile(r"""(['"])tf32\1""")
# The criteria layer's finding, as infraops/experiments/analysis.py `_criteria` titles it and
# Feedback.agent_text prints it: "[FAIL criteria] criterion 'name' failed: detail".
CRITERION = re.compile(r"^\[\w+ criteria\] criterion '(.+)' (passed|failed|not run): (.*)$",
                       re.M)


class Unexpected(Exception):
    """The run sent something the script does not know how to read."""


def _found(pattern: str, text: str, what: str, flags: int = re.M) -> re.Match[str]:
    match = re.search(pattern, text, flags)
    if match is None:
        raise Unexpected(f"expected {what}, got: {text[:300]}")
    return match


def _queued(result: str) -> int:
    """The id of the experiment run_experiment queued."""
    return int(_found(r"Experiment (\d+) queued", result, "a queued experiment").group(1))


def _compare_probe(probes: str) -> tuple[str, dict[str, list[str]], str] | None:
    """From list_probes: the probe with a compare rule, its variant cells, its rule; None
    when no probe has one."""
    for block in re.split(r"(?m)^(?=- )", probes):
        rule = re.search(r"compare: (\[[^\]]+\] must match \[[^\]]+\][^\n]*)", block)
        if rule is None:
            continue
        name = _found(r"^- (\S+) ", block, "a probe name").group(1)
        cells = re.findall(r"\[([^\]]+)\]", _found(r"variant cells \(\d+\): (.+)", block,
                                                     "its variant cells").group(1))
        return name, {name: cells}, rule.group(1)
    return None


def precision_fixer(first: Turn) -> Script:
    """The agent of the precision problem; see the module docstring."""
    turn = yield [call("list_probes")]
    probes = turn.result("list_probes")
    compared = _compare_probe(probes)
    if compared is not None:
        yield from _rule_fixer(*compared)
    else:
        yield from _criterion_fixer(first.goal, probes)


def _rule_fixer(name: str, variants: dict[str, list[str]], rule: str) -> Script:
    """The precision problem seen by a probe's compare rule (the demo target)."""
    turn = yield [call("run_experiment", probes=[name], variants=variants,
                       reason=f"Does the unchanged parallel path hold its rule ({rule})?")]
    base = _queued(turn.result("run_experiment"))
    news = turn.experiment_news(base)
    # One finding per cause: "... cases len-4096, len-1024 mismatch", the worst case first.
    failing = [case for named in re.findall(
        r"\[FAIL correctness\] \S+ .*? cases? (\S+(?:, \S+)*) mismatch", news)
        for case in named.split(", ")]
    if not failing:
        yield [call("finish", summary=f"The unchanged code holds its rule ({rule}): "
                                      "nothing to fix.")]
        return
    turn = yield [call("case_detail", experiment_id=base, probe=name, case=failing[0])]
    turn = yield [call("search_code", pattern=r"^INPUT_PRECISION\s*=", path_glob="**/*.py")]
    path = _found(r"^(\S+\.py):\d+: INPUT_PRECISION", turn.result("search_code"),
                  "where the precision is set").group(1)
    turn = yield [call("read_file", path=path)]
    line = _found(PRECISION.pattern, turn.result("read_file"), "the precision line")
    old_line, old = line.group(1), line.group(2)
    turn = yield [call("edit_file", path=path, old_text=old_line,
                       new_text='INPUT_PRECISION = "tf32x3"')]
    turn = yield [call("run_experiment", probes=[name], variants=variants,
                       reason=f"tf32x3 splits each input into two TF32 parts: the merge should "
                              f"now hold {rule} at every length")]
    fixed = _queued(turn.result("run_experiment"))
    news = turn.experiment_news(fixed)
    if "[FAIL" in news:
        yield [call("finish", summary=f"tf32x3 did not fix it: {news[:500]}")]
        return
    turn = yield [call("submit_change", title=f"Merge the CP states' dot in tf32x3, not {old}",
                       hypothesis=(f"The context-parallel merge's {old} dot loses precision at "
                                   f"every merge, so the error grew with the context length "
                                   f"({', '.join(failing)} failed {rule}); tf32x3 keeps it "
                                   "within the rule."),
                       experiment_id=fixed)]
    yield [call("finish", summary=f"Fixed the parallel merge's drift: INPUT_PRECISION {old} -> "
                                  "tf32x3; the change waits for review.")]


@dataclass(frozen=True)
class Baseline:
    """What the unchanged code measured: its experiment, the criterion it failed and the
    verdict's words, and the errors per case (case, metric, value) of the metric the goal's
    metric summarises, the smallest case first (none when the news cut those findings)."""

    experiment: int
    criterion: str
    detail: str
    errors: list[tuple[str, str, str]]


def _criterion_fixer(goal: dict[str, Any], probes: str) -> Script:
    """The precision problem seen by the goal's criteria on the goal's own probe."""
    probe, metric = str(goal["goal"]["probe"]), str(goal["goal"]["metric"])
    _found(rf"^- {re.escape(probe)} ", probes, f"the goal's probe {probe} among the probes")
    if not goal.get("criteria"):
        raise Unexpected("no probe has a compare rule and the goal has no criteria to judge "
                         "a fix by")
    turn = yield [call("run_experiment", probes=[probe],
                       reason=f"Does the unchanged code meet the goal's criteria "
                              f"({'; '.join(goal['criteria'])})?")]
    base = _queued(turn.result("run_experiment"))
    news = _succeeded(turn.experiment_news(base), base)
    failed = _failed_criterion(news)
    if failed is None:
        yield [call("finish", summary=f"The unchanged code meets its criteria on {probe} "
                                      f"(experiment {base}: {_passing(news)}): nothing to fix.")]
        return
    name, detail = failed
    baseline = Baseline(base, name, detail, _case_errors(news, probe, metric))
    yield from _raise_to_tf32x3(probe, metric, baseline, _search_glob(goal))


def _raise_to_tf32x3(probe: str, metric: str, baseline: Baseline, glob: str) -> Script:
    """Find the one precision setting naming tf32, make it tf32x3, check the criterion on
    the goal's probe, and submit the change with what was measured."""
    turn = yield [call("search_code", pattern=SETTING, path_glob=glob)]
    path, number, setting = _one_setting(turn.result("search_code"))
    turn = yield [call("read_file", path=path, start_line=max(1, number - 20),
                       end_line=number + 20)]
    old_line = _found(rf"^\s*{number}\t(.*)$", turn.result("read_file"),
                      f"line {number} of {path}").group(1)
    _found(SETTING, old_line, f"the precision setting on line {number} of {path}")
    turn = yield [call("edit_file", path=path, old_text=old_line,
                       new_text=QUOTED_TF32.sub(r"\1tf32x3\1", old_line))]
    _found(rf"^Edited {re.escape(path)} ", turn.result("edit_file"), "the edit made")
    turn = yield [call("run_experiment", probes=[probe],
                       reason=f"tf32x3 splits each input into two TF32 parts: with {setting} "
                              f"at tf32x3, criterion '{baseline.criterion}' should pass")]
    fixed = _queued(turn.result("run_experiment"))
    news = turn.experiment_news(fixed)
    after = _criterion_after(news, fixed, baseline.criterion)
    if after is None:
        yield [call("finish", summary=f"tf32x3 did not fix it: {news[:500]}")]
        return
    errors = _case_errors(news, probe, metric)
    if errors:
        after += f"; {_series(errors[-1:])}"
    turn = yield [call("submit_change", title=f"{setting} in tf32x3, not tf32",
                       hypothesis=_hypothesis(setting, path, baseline, fixed, after),
                       experiment_id=fixed)]
    yield [call("finish", summary=f"Fixed criterion '{baseline.criterion}': {setting} tf32 -> "
                                  f"tf32x3 in {path}; the change waits for review.")]


def _ran_through(news: str, experiment: int) -> bool:
    """Whether the experiment's probes all ran to the end (a failed one says why instead)."""
    return news.startswith(f"Experiment {experiment} succeeded.")


def _succeeded(news: str, experiment: int) -> str:
    """The news of an experiment whose probes ran to the end; Unexpected otherwise."""
    if not _ran_through(news, experiment):
        raise Unexpected(f"experiment {experiment} did not succeed: {news[:300]}")
    return news


def _failed_criterion(news: str) -> tuple[str, str] | None:
    """The first failed criterion's name and verdict; None when every criterion judged
    passed and nothing else failed (a passed criterion comes last in the feedback and may be
    cut from it, so its absence alone says nothing)."""
    verdicts = CRITERION.findall(news)
    failed = [(name, detail) for name, word, detail in verdicts if word == "failed"]
    if failed:
        name, detail = failed[0]
        if "unmeasured" in detail:
            raise Unexpected(f"criterion '{name}' was not measured: {detail}")
        return name, detail
    if "[FAIL" in news or any(word == "not run" for _, word, _ in verdicts):
        raise Unexpected(f"no criterion failed, but not all passed: {news[:300]}")
    return None


def _passing(news: str) -> str:
    """What says the criteria hold: their passed verdicts, else the feedback's verdict."""
    passed = [f"criterion '{name}' passed" for name, word, _ in CRITERION.findall(news)
              if word == "passed"]
    return "; ".join(passed) or _found(r"^Verdict: ([^(\n]*?) \(", news, "a verdict").group(1)


def _criterion_after(news: str, experiment: int, criterion: str) -> str | None:
    """What says `criterion` passes in the experiment's news: its passed verdict, or, when
    the line was cut from the feedback, a verdict with no failure at all; None when it does
    not pass."""
    if not _ran_through(news, experiment):
        return None
    for name, word, detail in CRITERION.findall(news):
        if name == criterion:
            return f"criterion '{name}' {word}: {detail}" if word == "passed" else None
    if "[FAIL" in news:
        return None
    return f"nothing failed ({_passing(news)})"


def _case_errors(news: str, probe: str, metric: str) -> list[tuple[str, str, str]]:
    """Per case, the candidate median of the metric the goal's metric summarises (`rel_error`
    for `max_rel_error`), from the performance findings; the smallest case first."""
    line = (rf"^\[\w+ performance\] {re.escape(probe)} case (\S+) (\w+) "
            r".*?median [^\s,]+ -> ([^\s,]+)")
    found = [(case, name, value) for case, name, value in re.findall(line, news, re.M)
             if name == metric or metric.endswith(f"_{name}")]
    return sorted(found, key=lambda error: _size(error[0]))


def _size(case: str) -> tuple[int, ...]:
    """A case's size from the numbers in its name: 'len-1024' -> (1024,)."""
    return tuple(int(number) for number in re.findall(r"\d+", case))


def _series(errors: list[tuple[str, str, str]]) -> str:
    return ", ".join(f"{metric} {value} at {case}" for case, metric, value in errors)


def _search_glob(goal: dict[str, Any]) -> str:
    """Where to look for the setting: the goal's one editable glob (a setting elsewhere
    could not be changed), else every Python file."""
    paths = goal.get("editable_paths") or []
    return str(paths[0]) if len(paths) == 1 else "**/*.py"


def _one_setting(result: str) -> tuple[str, int, str]:
    """From search_code: the path, line and name of the one setting it found."""
    matches = re.findall(r"^(\S+):(\d+): (\w*PRECISION)\s*=", result, re.M)
    if len(matches) != 1:
        raise Unexpected(f"expected one precision setting naming tf32, found {len(matches)}: "
                         f"{result[:300]}")
    path, number, setting = matches[0]
    return path, int(number), setting


def _hypothesis(setting: str, path: str, baseline: Baseline, fixed: int, after: str) -> str:
    grows = _grows(baseline.errors)
    if not baseline.errors:
        measured = ""
    elif grows:
        measured = f" the error grew with the length ({_series(baseline.errors)}) and"
    else:
        measured = f" the error did not grow with the length ({_series(baseline.errors)}) and"
    return (f"{setting} in {path} runs a dot in tf32, which rounds its inputs to TF32's "
            f"10-bit mantissa at every step"
            f"{', so the error grows with the length' if grows else ''}. On the "
            f"unchanged code (experiment {baseline.experiment}){measured} criterion "
            f"'{baseline.criterion}' failed: {baseline.detail}. tf32x3 splits each input "
            f"into two TF32 parts; with it (experiment {fixed}) {after}.")


def _grows(errors: list[tuple[str, str, str]]) -> bool:
    """Whether the errors, smallest case first, grow with the size: never falling from one
    case to the next, the largest case's at least twice the smallest's. Said only when the
    measurements show it: on the real merge (examples/fla-cp) they do not."""
    try:
        values = [float(value) for _case, _metric, value in errors]
    except ValueError:
        return False
    return (len(values) >= 2 and all(b >= a for a, b in itertools.pairwise(values))
            and values[-1] >= 2 * values[0])


def _guarded(first: Turn) -> Script:
    """precision_fixer, finishing with the reason when the run sends the unexpected."""
    script = precision_fixer(first)
    answer: Any = next(script)
    while True:
        turn = yield answer
        try:
            answer = script.send(turn)
        except StopIteration:
            return
        except (Unexpected, AssertionError) as exc:
            yield [call("finish", summary=f"The demo agent stopped: {exc}")]
            return


class DemoModel:
    """The endpoint's reply function: one scripted agent per conversation."""

    def __init__(self) -> None:
        self._agents: dict[str, ScriptedAgent] = {}
        self._lock = threading.Lock()

    def __call__(self, request: ReceivedRequest) -> StubReply:
        key = _conversation(request)
        with self._lock:
            agent = self._agents.get(key)
            if agent is None or _opening(request):
                agent = self._agents[key] = ScriptedAgent(_guarded)
        return agent(request)


def _conversation(request: ReceivedRequest) -> str:
    """What names a run's conversation: its goal message without what moves at every step
    (the budgets left)."""
    messages = (request.body or {}).get("messages") or []
    for message in messages:
        if not isinstance(message, dict) or message.get("role") != "user":
            continue
        try:
            opening = json.loads(str(message.get("content")))
        except ValueError:
            continue
        if isinstance(opening, dict) and "budgets_left" in opening:
            opening.pop("budgets_left")
            return hashlib.sha256(json.dumps(opening, sort_keys=True).encode()).hexdigest()
    return ""


def _opening(request: ReceivedRequest) -> bool:
    """A run's first step: nothing answered yet."""
    messages = (request.body or {}).get("messages") or []
    return not any(isinstance(m, dict) and m.get("role") == "assistant" for m in messages)

