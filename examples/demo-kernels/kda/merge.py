"""Context-parallel merge of KDA states: a numpy model of the Triton kernel's tl.dot.

tl.dot on FP32 inputs runs in TF32 by default (10-bit mantissa): fast, and the error
accumulates across merges. "tf32x3" splits each input into a TF32 high part and a TF32 low
part and sums three products: nearly FP32 accuracy at a fraction of the cost.
"""

import numpy as np

INPUT_PRECISION = "tf32"


def tf32(x):
    """Round float32 values to TF32 (10 mantissa bits), to nearest even."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounding = np.uint32(0xFFF) + ((bits >> np.uint32(13)) & np.uint32(1))
    return ((bits + rounding) & np.uint32(0xFFFFE000)).view(np.float32)


def dot(a, b):
    if INPUT_PRECISION == "ieee":
        return np.float32(a) @ np.float32(b)
    if INPUT_PRECISION == "tf32x3":
        a_hi, b_hi = tf32(a), tf32(b)
        a_lo, b_lo = tf32(a - a_hi), tf32(b - b_hi)
        return a_hi @ b_hi + (a_hi @ b_lo + a_lo @ b_hi)
    return tf32(a) @ tf32(b)


def shard_transform(transitions, inputs):
    """(M, H) of one shard: its states map S to M @ S + H."""
    d = transitions.shape[-1]
    m = np.eye(d, dtype=np.float32)
    h = np.zeros((d, d), dtype=np.float32)
    for m_chunk, h_chunk in zip(transitions, inputs):
        m = dot(m_chunk, m)  # merge state transformations across chunks
        h = dot(m_chunk, h) + h_chunk
    return m, h


def context_parallel(transitions, inputs, state, shard):
    """The CP path: per-shard transforms, then S_next = dot(M, S) + H across shards."""
    for start in range(0, len(transitions), shard):
        m, h = shard_transform(transitions[start:start + shard], inputs[start:start + shard])
        state = dot(m, state) + h
    return state


def sequential(transitions, inputs, state):
    """The non-parallel path: one step at a time, in plain FP32."""
    for m_chunk, h_chunk in zip(transitions, inputs):
        state = np.float32(m_chunk) @ state + h_chunk
    return state
