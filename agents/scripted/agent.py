"""A scripted agent: a model played by test code through the OpenAIStub.

The script is a generator function. It is given the first :class:`Turn` (what the model was
sent for the run's first step) and yields what the model answers: a list of tool calls, or a
:class:`StubReply` as it is. Each later step's request comes back as the value of ``yield``,
so the script reads the last tool results and the news of the step (finished experiments'
feedback, people's messages) and decides its next call from them::

    def script(turn: Turn) -> Script:
        turn = yield [call("read_file", path="kda/merge.py")]
        line = re.search(r'INPUT_PRECISION = "\\w+"', turn.result("read_file")).group(0)
        turn = yield [call("edit_file", path="kda/merge.py", old_text=line, new_text=...)]

    agent = ScriptedAgent(script)
    agent.install(stub)

One request per step: a request for a step already answered (the same step taken again, a
duplicate task) gets the same answer again, and the script does not advance. While
``agent.up`` is False every request is answered with a dropped connection and the script does
not advance either (an endpoint that is down). What the script raises becomes a 500 and lands
in ``stub.errors``; ``agent.failure`` says it too.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

from agents.scripted.endpoint import (
    OpenAIStub,
    ReceivedRequest,
    StubReply,
    completion,
    dropped,
)

ToolCalls = list[tuple[str, dict[str, Any]]]
Answer = ToolCalls | StubReply
Script = Generator[Answer, "Turn", None]


def call(name: str, **arguments: Any) -> tuple[str, dict[str, Any]]:
    return (name, arguments)


@dataclass(frozen=True)
class ToolResult:
    name: str
    arguments: dict[str, Any]
    content: str


@dataclass(frozen=True)
class Turn:
    """One request the model received, read as a model would."""

    request: ReceivedRequest

    @property
    def messages(self) -> list[dict[str, Any]]:
        return list(self.request.body["messages"])

    @property
    def text(self) -> str:
        """Everything sent, as one string (to look for a phrase anywhere)."""
        return json.dumps(self.request.body, ensure_ascii=False)

    @property
    def goal(self) -> dict[str, Any]:
        """The goal message: goal, criteria, paths, budgets left, manifest."""
        for message in self.messages:
            if message["role"] != "user":
                continue
            try:
                value = json.loads(message["content"])
            except (TypeError, ValueError):
                continue
            if isinstance(value, dict) and "budgets_left" in value:
                return value
        raise AssertionError("no goal message (with budgets_left) in the request")

    @property
    def steps_left(self) -> int:
        return int(self.goal["budgets_left"]["steps"])

    def _last_assistant(self) -> int:
        indices = [i for i, m in enumerate(self.messages) if m["role"] == "assistant"]
        return indices[-1] if indices else -1

    @property
    def results(self) -> list[ToolResult]:
        """The tool results of the previous step, in call order."""
        at = self._last_assistant()
        if at < 0:
            return []
        messages = self.messages
        calls = {c["id"]: c["function"] for c in messages[at].get("tool_calls") or []}
        found = []
        for message in messages[at + 1:]:
            if message["role"] != "tool":
                continue
            function = calls.get(message["tool_call_id"], {"name": "?", "arguments": "{}"})
            try:
                arguments = json.loads(function["arguments"])
            except ValueError:
                arguments = {"raw": function["arguments"]}
            found.append(ToolResult(function["name"], arguments, str(message["content"])))
        return found

    def result(self, name: str) -> str:
        """The content of the previous step's (last) result of tool ``name``."""
        matching = [r.content for r in self.results if r.name == name]
        if not matching:
            raise AssertionError(f"the previous step has no {name} result; it has "
                                 f"{[r.name for r in self.results]}")
        return matching[-1]

    @property
    def news(self) -> list[str]:
        """What happened since the previous step (the user messages after its results)."""
        at = self._last_assistant()
        return [str(m["content"]) for m in self.messages[at + 1:] if m["role"] == "user"]

    def experiment_news(self, experiment: int) -> str:
        """The news message of a finished experiment: 'Experiment N <status>. Its feedback:'."""
        for text in self.news:
            if text.startswith(f"Experiment {experiment} "):
                return text
        raise AssertionError(f"no news of experiment {experiment} at this step: {self.news}")


class ScriptedAgent:
    """The stub's reply function for a run: see the module docstring."""

    def __init__(self, script: Callable[[Turn], Script]) -> None:
        self._script = script
        self._generator: Script | None = None
        self._lock = threading.Lock()
        self._answers: dict[int, StubReply] = {}
        self.turns: list[Turn] = []  # the turns it answered (not the dropped ones)
        self.answered: list[ToolCalls] = []  # the tool calls it answered them with, in order
        self.up = True
        self.done = False
        self.failure: str | None = None

    def install(self, stub: OpenAIStub, replies: int = 60) -> None:
        """Answer the stub's next ``replies`` requests."""
        for _ in range(replies):
            stub.push(self)

    def __call__(self, request: ReceivedRequest) -> StubReply:
        with self._lock:
            if not self.up:
                return dropped()
            if self.failure is not None:  # the script is over: say why every time
                raise AssertionError(f"the script failed earlier: {self.failure}")
            turn = Turn(request)
            step = turn.steps_left
            if step in self._answers:
                return self._answers[step]
            try:
                answer = self._advance(turn)
            except StopIteration:
                self.failure = "the script ended but the run asked for another step"
                raise AssertionError(self.failure) from None
            except BaseException as exc:
                self.failure = f"{type(exc).__name__}: {exc}"
                raise
            self.turns.append(turn)
            if isinstance(answer, StubReply):
                reply = answer
            else:
                self.answered.append(answer)
                reply = completion(
                    tool_calls=[(name, json.dumps(arguments)) for name, arguments in answer],
                    usage=(len(request.raw) // 4, 20))
            self._answers[step] = reply
            return reply

    def _advance(self, turn: Turn) -> Answer:
        if self._generator is None:
            self._generator = self._script(turn)
            return next(self._generator)
        return self._generator.send(turn)
