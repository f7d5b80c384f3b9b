"""GPU probe: flash-linear-attention's context-parallel merge (fla/ops/cp/chunk_merge.py,
`chunk_cp_merge`) at the precision the code sets (`CP_DOT_PRECISION`), against float64.

Context parallelism splits a long sequence into chunks; each chunk is summarised by the pair
[h_local | M] (its state from zero, K x V, and its transition, K x K), and the merge composes
the summaries of every chunk before a rank: h <- M h + h_local, one matrix product per chunk,
in `tl.dot` at `CP_DOT_PRECISION`. Rounding in each product is carried into the next, so the
error of the merged state grows with the number of chunks merged.

The summaries are the exact ones of KDA's recurrence (fla/ops/kda/naive.py: per token
S <- (I - beta k k^T) diag(exp g) S + beta k v^T) over 64-token chunks, made in float64 and
stored in float32 as the library stores them. Inputs are drawn as the library's own
context-parallel test draws them (tests/context_parallel/test_cp_kda.py, with the layer's
initialisation, fla/layers/kda.py): the gate -exp(A_log) * softplus(g + dt_bias) with
A_log = log U(1, 16) and dt log-uniform in [0.001, 0.1], so some key channels keep their
state over many chunks, as a long-context model needs; the gate's input g, keys and values
standard normal, keys normalised, beta = sigmoid of a standard normal. The reference composes
the same float32 summaries in float64, so what is measured is the merge alone.

Per case (`len-<chunks>`, label size = chunks merged: 16, 64, 256, 1024): `rel_error`
(max |h - h_ref| / max |h_ref|) and `merge_us` (one merge, CUDA events, after the library's
autotuning and 5 warm-up merges; median of 20). Overall: `max_rel_error`, the worst length,
and `slowest_retention`: how much of the state the slowest key channel keeps across one
chunk (median over chunks and heads). Near 0, every summary would forget what came before and
the merge would be a no-op that no precision could get wrong: the figure says what was
measured. Seeded by INFRAOPS_SEED. Needs an NVIDIA GPU of compute capability 8.0 or newer
(the library refuses others).
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import statistics
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from fla.ops.cp import chunk_merge  # noqa: E402

HEADS, K, V, CHUNK = 8, 128, 128, 64
LENGTHS = (16, 64, 256, 1024)
WARMUP, REPEATS = 5, 20

if not torch.cuda.is_available():
    sys.exit("cp_merge.py needs a CUDA GPU")
DEVICE = torch.device("cuda")
torch.backends.cuda.matmul.allow_tf32 = False  # the float64 reference is plain float64


def summaries(chunks: int, generator: torch.Generator) -> tuple[torch.Tensor, float]:
    """[chunks, HEADS, K, V + K] float32: each chunk's [h_local | M], made in float64; and the
    slowest channel's retention over a chunk (median over chunks and heads)."""
    f64 = torch.float64

    def normal(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=generator, device=DEVICE, dtype=f64)

    dt = torch.exp(torch.rand(HEADS, K, generator=generator, device=DEVICE, dtype=f64)
                   * (math.log(0.1) - math.log(0.001)) + math.log(0.001)).clamp(min=1e-4)
    dt_bias = dt + torch.log(-torch.expm1(-dt))
    a = torch.rand(HEADS, generator=generator, device=DEVICE, dtype=f64) * 15 + 1
    eye = torch.eye(K, device=DEVICE, dtype=f64)
    transition = eye.expand(chunks, HEADS, K, K).clone()
    local = torch.zeros(chunks, HEADS, K, V, device=DEVICE, dtype=f64)
    kept = torch.ones(chunks, HEADS, K, device=DEVICE, dtype=f64)
    for _ in range(CHUNK):
        k = F.normalize(normal(chunks, HEADS, K), dim=-1)
        v = normal(chunks, HEADS, V)
        beta = torch.sigmoid(normal(chunks, HEADS))[..., None]
        decay = torch.exp(-a[:, None] * F.softplus(normal(chunks, HEADS, K) + dt_bias))
        kept.mul_(decay)
        for state in (transition, local):  # S <- (I - beta k k^T) diag(exp g) S
            state.mul_(decay[..., None])
            state.sub_(beta[..., None] * k[..., None] * (k[..., None] * state).sum(-2, keepdim=True))
        local.add_(beta[..., None] * k[..., None] * v[..., None, :])
    retention = kept.amax(-1).median().item()
    return torch.cat([local, transition], dim=-1).float().contiguous(), retention


def merged(hm: torch.Tensor, chunks: int) -> torch.Tensor:
    """The library's merge of the first `chunks` summaries (a rank after `chunks` ranks)."""
    state = torch.empty(HEADS, K, V, device=DEVICE, dtype=torch.float32)
    chunk_merge.chunk_cp_merge(state, hm[: chunks + 1], num_ranks=chunks, rank=chunks)
    return state


def reference(hm: torch.Tensor, chunks: int) -> torch.Tensor:
    state = torch.zeros(HEADS, K, V, device=DEVICE, dtype=torch.float64)
    for summary in hm[:chunks].double():
        state = summary[..., V:] @ state + summary[..., :V]
    return state


def time_us(hm: torch.Tensor, chunks: int) -> float:
    for _ in range(WARMUP):
        merged(hm, chunks)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(REPEATS)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(REPEATS)]
    for start, end in zip(starts, ends, strict=True):
        start.record()
        merged(hm, chunks)
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)) * 1e3


def main() -> None:
    out = pathlib.Path(os.environ["INFRAOPS_OUT"])
    generator = torch.Generator(device=DEVICE).manual_seed(
        int(os.environ.get("INFRAOPS_SEED", "0")))
    # One more summary than merged: the slot of the rank itself, which the merge never reads.
    hm, retention = summaries(max(LENGTHS) + 1, generator)
    rows, worst = [], 0.0
    for chunks in LENGTHS:
        state = merged(hm, chunks).double()
        expected = reference(hm, chunks)
        error = ((state - expected).abs().max() / expected.abs().max()).item()
        worst = max(worst, error)
        labels = {"size": chunks}
        rows += [{"name": "rel_error", "value": error, "unit": "ratio", "case": f"len-{chunks}",
                  "labels": labels},
                 {"name": "merge_us", "value": time_us(hm, chunks), "unit": "us",
                  "case": f"len-{chunks}", "labels": labels}]
    rows.append({"name": "max_rel_error", "value": worst, "unit": "ratio"})
    rows.append({"name": "slowest_retention", "value": retention, "unit": "ratio"})
    (out / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


if __name__ == "__main__":
    main()
