"""One KDA decode step (a numpy model of the kernel), tiled along the V dimension as
kernel/tiling.py says: each block recomputes the normalisation and the gating.
"""

import numpy as np

from kernel.tiling import blocks


def _normalise(x):
    return x / np.sqrt(np.sum(x * x) + np.float32(1e-6))


def _gate(g):
    return np.exp(-np.logaddexp(np.float32(0), -g))  # sigmoid, stably


def decode_step(q, k, v, g, state, tracer=None):
    """state[dk, dv] <- gate * state + k^T v; returns q @ state."""
    dv = v.shape[-1]
    out = np.empty(dv, dtype=np.float32)
    for start, stop in blocks(dv):
        cols = slice(start, stop)
        with _span(tracer, "normalize"):
            qn, kn = _normalise(q), _normalise(k)
        with _span(tracer, "gate"):
            gate = _gate(g)
        with _span(tracer, "update"):
            state[:, cols] = gate[:, None] * state[:, cols] + np.outer(kn, v[cols])
            out[cols] = qn @ state[:, cols]
    return out


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _span(tracer, name):
    return tracer.span(name) if tracer is not None else _Null()
