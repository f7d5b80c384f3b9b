"""One KDA decode step (a numpy model of the kernel), tiled along the V dimension.

v2 tiles V into TILES blocks and, in each, recomputes the same FP32 normalisation of q and
k and the same gating: TILES times the work. MERGE_TILES = True is v3: one block, the
normalisation and gating computed once and kept (in registers, in the real kernel).
"""

import numpy as np

TILES = 4
MERGE_TILES = False


def _normalise(x):
    return x / np.sqrt(np.sum(x * x) + np.float32(1e-6))


def _gate(g):
    return np.exp(-np.logaddexp(np.float32(0), -g))  # sigmoid, stably


def decode_step(q, k, v, g, state, tracer=None):
    """state[dk, dv] <- gate * state + k^T v; returns q @ state."""
    dv = v.shape[-1]
    blocks = 1 if MERGE_TILES else TILES
    width = dv // blocks
    out = np.empty(dv, dtype=np.float32)
    for b in range(blocks):
        cols = slice(b * width, (b + 1) * width)
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
