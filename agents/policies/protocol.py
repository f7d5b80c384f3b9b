"""What a policy is, as the step runner (``run_step`` in agents/services.py) calls it.

Per step the runner calls, in this order:

1. ``policy.prepare(run)`` under the run's row lock: what the step will send;
2. ``prepared.think()`` with no lock and no database writes of the run (a slow model must
   not hold Pause and Cancel);
3. under the lock again, only if the run is still at this step and running,
   ``thought.act(run)``, whose :class:`StepOutcome` the runner applies; otherwise
   ``thought.spent()``, what the dropped thought cost (a model's tokens still count).

``policy.stuck(run)`` is checked before a step; empty means not stuck. ``prepare`` and
``act`` may raise DomainError or GitError, which end the run as failed.

Each policy module (``llm``, ``tuner``) keeps its own types for what it prepared and
thought: :class:`PolicyModule` states how its five functions fit together, and
:class:`ModulePolicy` hides those types inside the step's objects, so that the registry of
policies names one type, :class:`Policy`, and mypy still checks each module's functions
against each other. ``ModulePolicy`` reads the module's functions at call time (a test may
replace one).
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from agents.policies.outcome import StepOutcome

if TYPE_CHECKING:
    from agents.models import AgentRun

PreparedT = TypeVar("PreparedT")
ThoughtT = TypeVar("ThoughtT")


class Thought(Protocol):
    """A step's thought, taken with no lock; acted on under the lock, or dropped."""

    def act(self, run: AgentRun) -> StepOutcome: ...

    def spent(self) -> tuple[int, Decimal]: ...


class PreparedStep(Protocol):
    """A step as prepared under the run's lock, ready to be thought about without it."""

    def think(self) -> Thought: ...


class Policy(Protocol):
    """A policy: how to prepare a step of a run, and whether the run is stuck."""

    def prepare(self, run: AgentRun) -> PreparedStep: ...

    def stuck(self, run: AgentRun) -> str: ...


class PolicyModule(Protocol[PreparedT, ThoughtT]):
    """A policy module's functions: ``think`` takes what ``prepare`` returned, ``act`` and
    ``spent`` take what ``think`` returned."""

    def prepare(self, run: AgentRun) -> PreparedT: ...

    def think(self, prepared: PreparedT) -> ThoughtT: ...

    def act(self, run: AgentRun, prepared: PreparedT, thought: ThoughtT) -> StepOutcome: ...

    def spent(self, thought: ThoughtT) -> tuple[int, Decimal]: ...

    def stuck(self, run: AgentRun) -> str: ...


@dataclass(frozen=True)
class ModulePolicy(Generic[PreparedT, ThoughtT]):
    """A :class:`PolicyModule` as a :class:`Policy`."""

    module: PolicyModule[PreparedT, ThoughtT]

    def prepare(self, run: AgentRun) -> PreparedStep:
        return _Prepared(self.module, self.module.prepare(run))

    def stuck(self, run: AgentRun) -> str:
        return self.module.stuck(run)


@dataclass(frozen=True)
class _Prepared(Generic[PreparedT, ThoughtT]):
    module: PolicyModule[PreparedT, ThoughtT]
    prepared: PreparedT

    def think(self) -> Thought:
        return _Thought(self.module, self.prepared, self.module.think(self.prepared))


@dataclass(frozen=True)
class _Thought(Generic[PreparedT, ThoughtT]):
    module: PolicyModule[PreparedT, ThoughtT]
    prepared: PreparedT
    thought: ThoughtT

    def act(self, run: AgentRun) -> StepOutcome:
        return self.module.act(run, self.prepared, self.thought)

    def spent(self) -> tuple[int, Decimal]:
        return self.module.spent(self.thought)
