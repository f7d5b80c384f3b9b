"""The inputs both numerics probes read: per context length and trial, rotations (they keep
the state's norm, so errors accumulate instead of decaying), small inputs and a start state,
seeded by INFRAOPS_SEED."""

import numpy as np

D, SHARD, TRIALS = 8, 16, 4
LENGTHS = (64, 256, 1024, 4096)


def inputs(seed, length, trial):
    rng = np.random.default_rng([seed, length, trial])
    q = np.linalg.qr(rng.standard_normal((length, D, D)))[0].astype(np.float32)
    h = (0.01 * rng.standard_normal((length, D, D))).astype(np.float32)
    s0 = rng.standard_normal((D, D)).astype(np.float32)
    return q, h, s0
