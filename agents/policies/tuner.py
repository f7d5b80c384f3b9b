"""The built-in tuner: optuna ask/tell over the manifest's knobs. No LLM, no Django.

The study is rebuilt from the run's recorded trials at every step (one step per task), so
the tuner keeps no process state and a step can run on any worker.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import optuna

from infraops.manifest import Knob, knob_values

optuna.logging.set_verbosity(optuna.logging.WARNING)
# BruteForceSampler is marked experimental since optuna 3.1; its ask/tell use is stable.
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


@dataclass(frozen=True)
class Trial:
    """A knob configuration and its objective: candidate/baseline of the goal metric,
    oriented so that lower is better (None: failed or not measured yet)."""

    params: dict[str, str]
    objective: float | None


def _distribution(knob: Knob) -> optuna.distributions.BaseDistribution:
    if knob.values is not None or (knob.range is not None and knob.range[2] is not None):
        return optuna.distributions.CategoricalDistribution(knob_values(knob))
    assert knob.range is not None
    return optuna.distributions.FloatDistribution(knob.range[0], knob.range[1])


def space_size(knobs: Sequence[Knob]) -> float:
    """How many configurations exist (inf when a knob is continuous)."""
    size = 1.0
    for knob in knobs:
        dist = _distribution(knob)
        if isinstance(dist, optuna.distributions.CategoricalDistribution):
            size *= len(dist.choices)
        else:
            return math.inf
    return size


def suggest(knobs: Sequence[Knob], trials: Sequence[Trial], *, seed: int) -> dict[str, str]:
    """The next configuration to try, given every finished trial.

    A finite space is walked without repeats (brute force, shuffled by the seed); a continuous
    one is searched with TPE.
    """
    distributions = {knob.name: _distribution(knob) for knob in knobs}
    finite = math.isfinite(space_size(knobs))
    sampler: optuna.samplers.BaseSampler = (
        optuna.samplers.BruteForceSampler(seed=seed) if finite
        # The study is rebuilt every step: a fixed seed would repeat TPE's random start-up.
        else optuna.samplers.TPESampler(seed=seed + len(trials))
    )
    study = optuna.create_study(direction="minimize", sampler=sampler)
    for trial in trials:
        params: dict[str, Any] = {
            name: (float(value) if isinstance(distributions[name],
                                              optuna.distributions.FloatDistribution) else value)
            for name, value in trial.params.items() if name in distributions
        }
        study.add_trial(optuna.trial.create_trial(
            params=params, distributions={n: distributions[n] for n in params},
            value=trial.objective,
            state=(optuna.trial.TrialState.COMPLETE if trial.objective is not None
                   else optuna.trial.TrialState.FAIL),
        ))
    asked = study.ask(distributions)
    return {name: _format(value) for name, value in asked.params.items()}


def _format(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def objective(*, candidate: float | None, baseline: float | None, direction: str) -> float | None:
    """candidate/baseline oriented so that lower is better; None when unmeasured."""
    if candidate is None or not baseline:
        return None
    ratio = candidate / baseline
    if direction == "maximize":
        return 1 / ratio if ratio else None
    return ratio
