"""The decode kernel as a Triton kernel, tiled along V as kernel/tiling.py says: each block
recomputes the normalisation of q and k and the gate (a projection, then a sigmoid), so four
blocks do that work four times; with MERGE_TILES one block does it once for all of V."""

import triton
import triton.language as tl


@triton.jit
def _decode(q_ptr, k_ptr, x_ptr, w_ptr, v_ptr, state_ptr, out_ptr,
            DK: tl.constexpr, DV: tl.constexpr, BLOCK_V: tl.constexpr):
    head = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    dk = tl.arange(0, DK)
    q = tl.load(q_ptr + head * DK + dk)
    k = tl.load(k_ptr + head * DK + dk)
    qn = q / tl.sqrt(tl.sum(q * q, 0) + 1e-6)  # the per-block work a merged block does once
    kn = k / tl.sqrt(tl.sum(k * k, 0) + 1e-6)
    x = tl.load(x_ptr + head * DK + dk)
    w = tl.load(w_ptr + dk[:, None] * DK + dk[None, :])
    gate = tl.sigmoid(tl.sum(x[:, None] * w, 0))
    v = tl.load(v_ptr + head * DV + cols)
    at = state_ptr + head * DK * DV + dk[:, None] * DV + cols[None, :]
    state = gate[:, None] * tl.load(at) + kn[:, None] * v[None, :]
    tl.store(at, state)
    tl.store(out_ptr + head * DV + cols, tl.sum(qn[:, None] * state, 0))


def decode_step(q, k, x, w, v, state, out, blocks):
    """One decode step of every head: `blocks` (kernel.tiling.blocks) sets the V tiling."""
    heads, dv = v.shape
    width = blocks[0][1] - blocks[0][0]
    _decode[(heads, len(blocks))](q, k, x, w, v, state, out, DK=q.shape[1], DV=dv,
                                  BLOCK_V=width)
