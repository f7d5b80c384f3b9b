"""The demo's model: a scripted agent that fixes the demo's precision problem (case 1 of
docs/product.md) from the feedback alone, served as an OpenAI-compatible endpoint by
`manage.py demo_llm` (and `standalone --demo-llm`), so a user without an API key watches the
LLM loop: it runs the correctness probe on the unchanged code, reads which case diverges,
searches the code for the merge's precision, raises it, checks, and submits the change.

Every decision comes from what the run sent it (tool results and experiment news), as a
model's would; when the run sends something it does not expect, it finishes and says what.
Each conversation (the goal message that opens it) gets an agent of its own.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from typing import Any

from agents.scripted.agent import Script, ScriptedAgent, Turn, call
from agents.scripted.endpoint import ReceivedRequest, StubReply

MODEL = "infraops-demo"
PRECISION = re.compile(r'^\s*\d+\t(INPUT_PRECISION = "(\w+)")$', re.M)


class Unexpected(Exception):
    """The run sent something the script does not know how to read."""


def _found(pattern: str, text: str, what: str, flags: int = re.M) -> re.Match[str]:
    match = re.search(pattern, text, flags)
    if match is None:
        raise Unexpected(f"expected {what}, got: {text[:300]}")
    return match


def _compare_probe(probes: str) -> tuple[str, dict[str, list[str]], str]:
    """From list_probes: the probe with a compare rule, its variant cells, its rule."""
    for block in re.split(r"(?m)^(?=- )", probes):
        rule = re.search(r"compare: (\[[^\]]+\] must match \[[^\]]+\][^\n]*)", block)
        if rule is None:
            continue
        name = _found(r"^- (\S+) ", block, "a probe name").group(1)
        cells = re.findall(r"\[([^\]]+)\]", _found(r"variant cells \(\d+\): (.+)", block,
                                                     "its variant cells").group(1))
        return name, {name: cells}, rule.group(1)
    raise Unexpected(f"no probe with a compare rule in: {probes[:300]}")


def precision_fixer(first: Turn) -> Script:
    """The agent of the precision problem; see the module docstring."""
    turn = yield [call("list_probes")]
    name, variants, rule = _compare_probe(turn.result("list_probes"))
    turn = yield [call("run_experiment", probes=[name], variants=variants,
                       reason=f"Does the unchanged parallel path hold its rule ({rule})?")]
    base = int(_found(r"Experiment (\d+) queued", turn.result("run_experiment"),
                      "a queued experiment").group(1))
    news = turn.experiment_news(base)
    failing = re.findall(r"\[FAIL correctness\] \S+ .*? case (\S+) mismatch", news)
    if not failing:
        yield [call("finish", summary=f"The unchanged code holds its rule ({rule}): "
                                      "nothing to fix.")]
        return
    turn = yield [call("case_detail", experiment_id=base, probe=name, case=failing[-1])]
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
    fixed = int(_found(r"Experiment (\d+) queued", turn.result("run_experiment"),
                       "a queued experiment").group(1))
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

