"""What a policy's step comes to: a typed outcome that agents/services.py applies.

A policy never writes the run's lifecycle (status, waiting, pausing) itself: it returns a
:class:`StepOutcome`, and the service records the step, then ends, pauses, waits, retries or
goes on, in that order of precedence.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Finish:
    status: str  # an AgentRun.Status that ends the run
    reason: str


@dataclass(frozen=True)
class Wait:
    """A wait before the step is taken again, with no step recorded (rate limits, provider
    faults): an event on the run page says why and for how long, unless `quiet` (a wait
    like the ones just announced: a storm of them would bury the run's log)."""

    seconds: float
    attempt: int
    reason: str
    quiet: bool = False


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

