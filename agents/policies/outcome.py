"""What a policy's step comes to: a typed outcome that agents/services.py applies.

A policy never writes the run's lifecycle (status, waiting, pausing) itself: it returns a
:class:`StepOutcome`, and the service records the step, then ends, pauses, waits, retries or
goes on, in that order of precedence.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Protocol


@dataclass(frozen=True)
class Finish:
    status: str  # an AgentRun.Status that ends the run
    reason: str


@dataclass(frozen=True)
class Wait:
    """A wait before the step is taken again, with no step recorded (rate limits, provider
    faults): an event on the run page says why and for how long."""

    seconds: float
    attempt: int
    reason: str


@dataclass
class StepOutcome:
    summary: str
    tool: str = ""  # the tools called, comma-separated ("" for none)
    calls: list[dict[str, Any]] = field(default_factory=list)  # see Step.calls
    record: dict[str, Any] = field(default_factory=dict)  # the policy's memory (Step.arguments)
    result: dict[str, Any] = field(default_factory=dict)  # the policy's result (Step.result)
    verdict: str = ""
    experiment: int | None = None
    finish: Finish | None = None
    pause: str | None = None
    wait_for: int | None = None  # an experiment id: the run sleeps until it ends
    retry: Wait | None = None  # take this step again later; nothing is recorded
    counts: bool = True  # False: no Step is recorded (the model was never reached), only the
    #                      finish or pause applies


class Policy(Protocol):
    """One module under agents/policies/. The service calls, per step:
    ``prepare`` under the run's row lock, ``think`` with no lock and no database writes of the
    run (a slow model must not hold Pause and Cancel), then ``act`` under the lock again, only
    if the run is still at this step and running; ``spent`` says what a thought cost when it is
    dropped (paused meanwhile); ``stuck`` is checked before a step (empty: not stuck)."""

    def prepare(self, run: Any) -> Any: ...

    def think(self, prepared: Any) -> Any: ...

    def act(self, run: Any, prepared: Any, thought: Any) -> StepOutcome: ...

    def spent(self, thought: Any) -> tuple[int, Decimal]: ...

    def stuck(self, run: Any) -> str: ...
