"""GPU probe: flash-linear-attention's KDA decode kernel (fla/ops/kda/fused_recurrent.py,
`fused_recurrent_kda_fwd`) at decode shapes, as a serving engine calls it: one token, the state
updated in place, the q/k normalisation, the gate and beta's sigmoid inside the kernel.

One case per shape: batch 1, 8, 32 and 64; 16 and 32 heads; K = V = 128; bf16 (what serving
runs) and fp32 (what the library's own tests of this kernel use). Per case it writes

- `decode_us`: the kernel's median time over 100 launches timed with CUDA events after 25
  warm-up launches, the L2 cache flushed before each (a 256 MiB write: twice the L2 or more),
  each launch a replay of a CUDA graph of the step, so the host's cost of the library's Python
  wrapper (about 80 us) is not timed;
- `err_ratio` and `max_abs_error`: the output and the new state against the same step in
  float64 (the library's naive recurrence, `fla/ops/kda/naive.py`, transcribed in float64:
  `naive_recurrent_kda` itself computes in float32 whatever it is given). `err_ratio` is the
  library's own measure (tests/ops/test_kda.py, `assert_close`: RMS of the difference over RMS
  of the reference, tolerance 0.005), the worse of output and state;
- the launch configuration and what it costs: `programs_per_head` (V tiles: programs that each
  load the same q, k, gate and beta and redo the same normalisation and gating), `num_warps`,
  `registers` per thread and `spills` of the compiled kernel.

Per batch (no case): `decode_us_b<B>`, the sum of that batch's cases, which the goal's criteria
read. Overall: `max_err_ratio`, the worst case's. The float64 transcription is checked against
`naive_recurrent_kda` on every case; a disagreement beyond 1e-4 stops the probe (exit 3): a
reference that is wrong makes every error it measures meaningless.

Inputs follow the library's conventions (its layer, fla/layers/kda.py, and its tests): q, k,
v and the gate's input standard normal; A_log = log U(1, 16) and dt_bias = softplus^-1 of a
log-uniform dt in [0.001, 0.1] (the layer's initialisation); beta's logits standard normal;
the state standard normal (the library's tests' h0). Seeded by INFRAOPS_SEED.

Needs a CUDA GPU (requires = ["gpu"]). With TRITON_INTERPRET=1 and no GPU it checks itself on
the CPU at two small cases, timing with the wall clock (for working on this script only).
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import statistics
import sys
import time
from collections import defaultdict

import torch
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from fla.ops.kda import fused_recurrent  # noqa: E402
from fla.ops.kda.naive import naive_recurrent_kda  # noqa: E402

K = V = 128
TOLERANCE = 0.005  # tests/ops/test_kda.py: assert_close(..., 0.005) on o and on the state
REFERENCE_CHECK = 1e-4  # float64 transcription vs naive_recurrent_kda (float32)
FLUSH_BYTES = 256 << 20

CUDA = torch.cuda.is_available()
WARMUP, REPEATS = (25, 100) if CUDA else (1, 1)
if not CUDA and os.environ.get("TRITON_INTERPRET") != "1":
    sys.exit("kda_decode.py needs a CUDA GPU (or TRITON_INTERPRET=1 to check the script)")
DEVICE = torch.device("cuda" if CUDA else "cpu")
BATCHES = (1, 8, 32, 64) if CUDA else (1, 2)
HEADS = (16, 32) if CUDA else (2,)
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32} if CUDA else {"fp32": torch.float32}


def draw(batch: int, heads: int, dtype: torch.dtype, generator: torch.Generator) -> dict:
    def normal(*shape: int, of: torch.dtype = dtype) -> torch.Tensor:
        return torch.randn(shape, generator=generator, device=DEVICE).to(of)

    dt = torch.exp(torch.rand(heads * K, generator=generator, device=DEVICE)
                   * (math.log(0.1) - math.log(0.001)) + math.log(0.001)).clamp(min=1e-4)
    a = torch.rand(heads, generator=generator, device=DEVICE) * 15 + 1
    return {
        "q": normal(batch, 1, heads, K), "k": normal(batch, 1, heads, K),
        "v": normal(batch, 1, heads, V), "g": normal(batch, 1, heads, K),
        "beta": normal(batch, 1, heads),
        "A_log": torch.log(a), "dt_bias": dt + torch.log(-torch.expm1(-dt)),
        "h0": normal(batch, heads, K, V, of=torch.float32),
    }


def kernel_step(x: dict, state: torch.Tensor) -> torch.Tensor:
    """One decode step through the library, the state updated in place; the output."""
    out, _ = fused_recurrent.fused_recurrent_kda_fwd(
        q=x["q"], k=x["k"], v=x["v"], g=x["g"], beta=x["beta"], A_log=x["A_log"],
        dt_bias=x["dt_bias"], initial_state=state, inplace_final_state=True,
        use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
        use_beta_sigmoid_in_kernel=True)
    return out


def activations(x: dict, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """The kernel's in-kernel preprocessing in `dtype`: normalised q and k, the log-space gate
    -exp(A_log) * softplus(g + dt_bias), sigmoid(beta)."""
    heads = x["A_log"].shape[0]
    q, k, g, beta = (x[n].to(dtype) for n in ("q", "k", "g", "beta"))
    q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
    k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    bias = x["dt_bias"].to(dtype).view(heads, K)
    gate = -torch.exp(x["A_log"].to(dtype))[:, None] * F.softplus(g + bias)
    return q, k, x["v"].to(dtype), gate, torch.sigmoid(beta)


def recurrence_f64(q, k, v, g, beta, h0):
    """naive_recurrent_kda's recurrence (fla/ops/kda/naive.py), line for line, in float64."""
    scale = K ** -0.5
    state = h0.to(torch.float64).clone()
    out = torch.zeros_like(v)
    for i in range(q.shape[1]):
        q_i, k_i, v_i, g_i, b_i = q[:, i] * scale, k[:, i], v[:, i], g[:, i], beta[:, i]
        state = state * g_i[..., None].exp()
        state = state + torch.einsum("b h k, b h v -> b h k v", b_i[..., None] * k_i,
                                     v_i - (k_i[..., None] * state).sum(-2))
        out[:, i] = torch.einsum("b h k, b h k v -> b h v", q_i, state)
    return out, state


def err_ratio(reference: torch.Tensor, value: torch.Tensor) -> float:
    """tests/ops/test_kda.py's measure (fla.utils.testing.get_err_ratio)."""
    difference = (reference - value.to(reference.dtype)).flatten()
    base = reference.flatten().square().mean().sqrt().item()
    return difference.square().mean().sqrt().item() / (base + 1e-8)


class Launches:
    """Stands in for the kernel object the library launches, to read its grid and the compiled
    kernel's facts (warps, registers, spills) at the first launch of a case."""

    def __init__(self, kernel: object) -> None:
        self.kernel = kernel
        self.grid: tuple[int, ...] = ()
        self.compiled: object = None

    def __getitem__(self, grid: tuple[int, ...]):
        launch = self.kernel[grid]  # type: ignore[index]

        def run(*args: object, **kwargs: object) -> object:
            self.grid = tuple(grid)
            self.compiled = launch(*args, **kwargs)
            return self.compiled

        return run


def launch_facts(x: dict, batch: int, heads: int) -> dict[str, float]:
    original = fused_recurrent.fused_recurrent_kda_fwd_kernel
    spy = Launches(original)
    fused_recurrent.fused_recurrent_kda_fwd_kernel = spy
    try:
        kernel_step(x, x["h0"].clone())
    finally:
        fused_recurrent.fused_recurrent_kda_fwd_kernel = original
    compiled = spy.compiled
    metadata = getattr(compiled, "metadata", None)
    facts = {"programs_per_head": spy.grid[0] / (batch * heads)}
    for name, value in (("num_warps", getattr(metadata, "num_warps", None)),
                        ("registers", getattr(compiled, "n_regs", None)),
                        ("spills", getattr(compiled, "n_spills", None))):
        if isinstance(value, int | float) and value >= 0:
            facts[name] = float(value)
    return facts


def time_us(x: dict) -> float:
    """The kernel's median time over REPEATS launches, the L2 flushed before each.

    The step is captured in a CUDA graph and the graph replayed between the events: a call
    through the library's Python wrapper costs the host about 80 us (seen on the H200), longer
    than the flush that should hide it, so timing the wrapper measured the host, flat across
    batch sizes. A replay costs the host a few microseconds."""
    state = x["h0"].clone()
    for _ in range(WARMUP):
        kernel_step(x, state)
    if not CUDA:
        started = time.perf_counter()
        kernel_step(x, state)
        return (time.perf_counter() - started) * 1e6
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            kernel_step(x, state)
        launch = graph.replay
    except RuntimeError as exc:  # a build that cannot be captured: the wrapper, timed as is
        print(f"no CUDA graph ({exc}); the host's cost of each call is timed too",
              file=sys.stderr)
        def launch() -> None:
            kernel_step(x, state)
    flush = torch.empty(FLUSH_BYTES, dtype=torch.int8, device=DEVICE)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(REPEATS)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(REPEATS)]
    for start, end in zip(starts, ends, strict=True):
        flush.zero_()
        start.record()
        launch()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)) * 1e3


def check(x: dict, dtype: torch.dtype) -> tuple[float, float]:
    """err_ratio and max_abs_error of the kernel's output and new state against float64."""
    state = x["h0"].clone()
    out = kernel_step(x, state)
    q, k, v, g, beta = activations(x, torch.float64)
    ref_out, ref_state = recurrence_f64(q, k, v, g, beta, x["h0"])
    naive_out, naive_state = naive_recurrent_kda(
        *activations(x, torch.float32), scale=K ** -0.5, initial_state=x["h0"].clone(),
        output_final_state=True)
    disagreement = max(err_ratio(ref_out, naive_out.float()), err_ratio(ref_state, naive_state))
    if disagreement > REFERENCE_CHECK:
        sys.exit(f"the float64 reference disagrees with naive_recurrent_kda: error ratio "
                 f"{disagreement:.3g} > {REFERENCE_CHECK:g}")
    ratio = max(err_ratio(ref_out, out), err_ratio(ref_state, state))
    worst = max((ref_out - out.to(torch.float64)).abs().max().item(),
                (ref_state - state.to(torch.float64)).abs().max().item())
    return ratio, worst


def main() -> None:
    out = pathlib.Path(os.environ["INFRAOPS_OUT"])
    seed = int(os.environ.get("INFRAOPS_SEED", "0"))
    rows: list[dict] = []
    per_batch: dict[int, float] = defaultdict(float)
    worst_ratio = 0.0
    for dtype_name, dtype in DTYPES.items():
        for heads in HEADS:
            for batch in BATCHES:
                generator = torch.Generator(device=DEVICE).manual_seed(
                    seed * 1_000_003 + batch * 101 + heads)
                x = draw(batch, heads, dtype, generator)
                case = f"b{batch}-h{heads}-{dtype_name}"
                labels = {"batch": batch, "heads": heads, "dtype": dtype_name, "size": batch}
                facts = launch_facts(x, batch, heads)
                micros = time_us(x)
                ratio, worst = check(x, dtype)
                worst_ratio = max(worst_ratio, ratio)
                per_batch[batch] += micros
                measured = {"decode_us": (micros, "us"), "err_ratio": (ratio, "ratio"),
                            "max_abs_error": (worst, "abs")}
                measured |= {name: (value, "count") for name, value in facts.items()}
                rows += [{"name": name, "value": value, "unit": unit, "case": case,
                          "labels": labels} for name, (value, unit) in measured.items()]
    rows += [{"name": f"decode_us_b{batch}", "value": total, "unit": "us"}
             for batch, total in sorted(per_batch.items())]
    rows.append({"name": "max_err_ratio", "value": worst_ratio, "unit": "ratio"})
    with (out / "metrics.jsonl").open("w") as metrics:
        metrics.writelines(json.dumps(row) + "\n" for row in rows)
    if worst_ratio > TOLERANCE:
        print(f"error ratio {worst_ratio:.3g} above the library's tolerance {TOLERANCE}",
              file=sys.stderr)


if __name__ == "__main__":
    main()
