"""The context-parallel merge as a Triton kernel: the chained state merge the numpy model in
kda/merge.py imitates, every tl.dot at one input_precision ("tf32", "tf32x3" or "ieee", the
values of kda.merge.INPUT_PRECISION)."""

import torch
import triton
import triton.language as tl

D = 16  # tl.dot needs at least 16 along each dimension


@triton.jit
def _chained_merge(q_ptr, h_ptr, s_ptr, out_ptr, length, D: tl.constexpr,
                   PRECISION: tl.constexpr):
    """One program a trial: M = Q_L ... Q_1, H_i = Q_i H_(i-1) + H_i, then M S0 + H."""
    trial = tl.program_id(0)
    rows = tl.arange(0, D)[:, None]
    cols = tl.arange(0, D)[None, :]
    tile = rows * D + cols
    base = trial * length * D * D
    m = tl.where(rows == cols, 1.0, 0.0).to(tl.float32)
    h = tl.zeros((D, D), dtype=tl.float32)
    for i in range(length):
        q = tl.load(q_ptr + base + i * D * D + tile)
        m = tl.dot(q, m, input_precision=PRECISION)
        h = tl.dot(q, h, input_precision=PRECISION) + tl.load(h_ptr + base + i * D * D + tile)
    s = tl.load(s_ptr + trial * D * D + tile)
    tl.store(out_ptr + trial * D * D + tile, tl.dot(m, s, input_precision=PRECISION) + h)


def context_parallel(q, h, s0, precision):
    """The merged state of each trial: q, h (trials, length, D, D), s0 (trials, D, D), fp32."""
    trials, length = q.shape[:2]
    out = torch.empty_like(s0)
    _chained_merge[(trials,)](q, h, s0, out, length, D=D, PRECISION=precision)
    return out


def sequential(q, h, s0):
    """One step at a time with torch's matmul, in the inputs' dtype (no TF32: the caller
    turns it off), batched over trials."""
    state = s0
    for i in range(q.shape[1]):
        state = torch.bmm(q[:, i], state) + h[:, i]
    return state
