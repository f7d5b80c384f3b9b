"""agents.policies.protocol and registry: every policy a goal can choose has an entry, and a
step's objects hand each module function what the previous one returned, reading the
functions when they are called."""

from __future__ import annotations

from decimal import Decimal

import pytest

from agents.models import AgentRun
from agents.policies.outcome import StepOutcome
from agents.policies.protocol import ModulePolicy
from agents.policies.registry import POLICIES
from infraops.models import Goal


class Recorder:
    """A policy module that names what it was given in what it returns."""

    def prepare(self, run: AgentRun) -> str:
        return f"prepared for run {run.pk}"

    def think(self, prepared: str) -> str:
        return f"thought of {prepared}"

    def act(self, run: AgentRun, prepared: str, thought: str) -> StepOutcome:
        return StepOutcome(f"run {run.pk} acted on {thought} ({prepared})")

    def spent(self, thought: str) -> tuple[int, Decimal]:
        return len(thought), Decimal("0.5")

    def stuck(self, run: AgentRun) -> str:
        return f"run {run.pk} is stuck"


def test_every_policy_a_goal_can_choose_is_registered() -> None:
    assert sorted(POLICIES) == sorted(Goal.Policy.values)


def test_a_step_hands_each_function_what_the_previous_one_returned() -> None:
    run = AgentRun(pk=7)
    policy = ModulePolicy(Recorder())

    thought = policy.prepare(run).think()

    assert thought.act(run).summary == ("run 7 acted on thought of prepared for run 7 "
                                        "(prepared for run 7)")
    assert thought.spent() == (len("thought of prepared for run 7"), Decimal("0.5"))
    assert policy.stuck(run) == "run 7 is stuck"


def test_a_function_replaced_after_the_step_was_prepared_is_the_one_called(
        monkeypatch: pytest.MonkeyPatch) -> None:
    run = AgentRun(pk=7)
    module = Recorder()
    prepared = ModulePolicy(module).prepare(run)

    monkeypatch.setattr(module, "think", lambda prepared: f"replaced, given {prepared}")

    assert prepared.think().act(run).summary == (
        "run 7 acted on replaced, given prepared for run 7 (prepared for run 7)")
