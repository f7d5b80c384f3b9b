"""Instruction-count probe: the decode step's blocks (kernel/tiling.py) with each block's work
in plain Python, counted under callgrind (measure = "instructions" in infraops.toml) where
wall time on a noisy machine cannot resolve a gain of a few percent. Run with `python3 -S`
and without numpy: numpy's import alone costs seconds under callgrind."""

import math
import os
import sys

# os.path, not pathlib: what the probe imports is counted too, and pathlib's imports vary
# with the hash seed.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from kernel.tiling import blocks  # noqa: E402

DK, DV, STEPS = 32, 32, 60


def normalise(x):
    norm = math.sqrt(sum(value * value for value in x) + 1e-6)
    return [value / norm for value in x]


def sigmoid(x):
    return 1 / (1 + math.exp(-x))


def decode(steps):
    """The decode steps, in a function: its variables are locals, not the module's globals,
    whose dictionary lookups would cost a different count under every hash seed."""
    q = [math.sin(i) for i in range(DK)]
    k = [math.cos(i) for i in range(DK)]
    g = [0.01 * i for i in range(DK)]
    v = [math.sin(0.5 * i) for i in range(DV)]
    state = [[0.0] * DV for _ in range(DK)]
    for _ in range(steps):
        for start, stop in blocks(DV):
            qn, kn = normalise(q), normalise(k)  # recomputed per block: what merging saves
            gate = [sigmoid(x) for x in g]
            for i in range(DK):
                row = state[i]
                for j in range(start, stop):
                    row[j] = gate[i] * row[j] + kn[i] * v[j]
    return qn, state


decode(STEPS)
with open(os.path.join(os.environ["INFRAOPS_OUT"], "metrics.jsonl"), "w"):
    pass  # the runner adds the instruction count
