"""agents.policies.tuner: optuna ask/tell over the manifest's knobs, rebuilt at every step."""

from __future__ import annotations

import itertools
import math

import pytest

from agents.policies.tuner import Trial, objective, shown, space_size, suggest
from infraops.manifest import Knob

BATCH = Knob("batch_size", "config/serving.toml", r"^batch_size = (\d+)$",
             values=("1", "2", "4", "8"))
QUEUE = Knob("max_queue", "config/serving.toml", r"^max_queue = (\d+)$", range=(64, 256, 64))
RATIO = Knob("ratio", "config/serving.toml", r"^ratio = ([0-9.]+)$", range=(0.1, 0.9, None))

pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")


def key(params: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(params.items()))


def walk(knobs: list[Knob], trials: list[Trial], steps: int, *, seed: int) -> list[dict[str, str]]:
    """Ask `steps` times, telling each answer back as a finished trial, as runs do."""
    asked = []
    for number in range(steps):
        params = suggest(knobs, trials, seed=seed)
        asked.append(params)
        trials.append(Trial(params, objective=1.0 + number / 10))
    return asked


@pytest.mark.parametrize(("knobs", "size"), [
    ([BATCH], 4),
    ([QUEUE], 4),
    ([BATCH, QUEUE], 16),
    ([BATCH, RATIO], math.inf),
    ([], 1),
])
def test_space_size_counts_configurations(knobs: list[Knob], size: float) -> None:
    assert space_size(knobs) == size


@pytest.mark.parametrize("seed", [1, 7, 42])
def test_a_finite_space_is_walked_without_repeats_until_it_is_covered(seed: int) -> None:
    knobs = [BATCH, QUEUE]

    asked = walk(knobs, [], int(space_size(knobs)), seed=seed)

    everything = {key({"batch_size": b, "max_queue": q})
                  for b, q in itertools.product(BATCH.values or (), ["64", "128", "192", "256"])}
    assert len({key(p) for p in asked}) == len(asked) == 16
    assert {key(p) for p in asked} == everything


def test_a_stepped_range_is_suggested_as_the_values_knob_apply_writes() -> None:
    asked = walk([QUEUE], [], 4, seed=3)

    assert sorted(p["max_queue"] for p in asked) == ["128", "192", "256", "64"]


def test_a_failed_trial_is_not_suggested_again() -> None:
    first = suggest([BATCH, QUEUE], [], seed=5)
    trials = [Trial(first, objective=None)]

    asked = walk([BATCH, QUEUE], trials, 15, seed=5)

    assert first not in asked
    assert len({key(p) for p in asked}) == 15


def test_trials_of_knobs_no_longer_in_the_manifest_are_ignored() -> None:
    old = [Trial({"batch_size": "1", "removed_knob": "x"}, objective=0.5)]

    asked = walk([BATCH], old, 3, seed=2)

    assert sorted(p["batch_size"] for p in asked) == ["2", "4", "8"]


def test_a_continuous_range_stays_within_its_bounds() -> None:
    trials: list[Trial] = []
    for _ in range(14):
        params = suggest([RATIO], trials, seed=11)
        value = float(params["ratio"])
        trials.append(Trial(params, objective=(value - 0.3) ** 2))

    values = [float(t.params["ratio"]) for t in trials]
    assert all(0.1 <= v <= 0.9 for v in values)
    assert len(set(values)) > 1  # a search, not a constant


def test_a_mixed_space_keeps_categorical_values_and_continuous_bounds() -> None:
    trials: list[Trial] = []
    for number in range(12):
        params = suggest([BATCH, RATIO], trials, seed=4)
        trials.append(Trial(params, objective=float(number)))

    assert all(t.params["batch_size"] in ("1", "2", "4", "8") for t in trials)
    assert all(0.1 <= float(t.params["ratio"]) <= 0.9 for t in trials)


def test_a_continuous_range_does_not_repeat_a_suggestion_during_start_up() -> None:
    trials: list[Trial] = []
    for number in range(5):
        params = suggest([RATIO], trials, seed=11)
        trials.append(Trial(params, objective=float(number)))

    assert len({t.params["ratio"] for t in trials}) == 5


@pytest.mark.parametrize(("candidate", "baseline", "direction", "expected"), [
    (8.0, 10.0, "minimize", 0.8),  # latency down 20%: better, below 1
    (12.0, 10.0, "minimize", 1.2),
    (12.0, 10.0, "maximize", 10 / 12),  # throughput up 20%: better, below 1
    (8.0, 10.0, "maximize", 1.25),
    (10.0, 10.0, "maximize", 1.0),
    (None, 10.0, "minimize", None),
    (8.0, None, "minimize", None),
    (8.0, 0.0, "minimize", None),
    (0.0, 10.0, "maximize", None),  # a zero throughput has no inverse
    (0.0, 10.0, "minimize", 0.0),
])
def test_objective_is_oriented_so_that_lower_is_better(
    candidate: float | None, baseline: float | None, direction: str, expected: float | None
) -> None:
    value = objective(candidate=candidate, baseline=baseline, direction=direction)

    assert value == (pytest.approx(expected) if expected is not None else None)


def test_a_configuration_is_shown_as_people_write_it() -> None:
    assert shown({"batch_size": "8", "workers": "2"}) == "batch_size=8, workers=2"
    assert shown({}) == "the base"
