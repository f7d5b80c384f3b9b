"""GPU performance probe: microseconds per decode step of the Triton decode kernel (every
head, the V tiling of kernel/tiling.py), timed with CUDA events over many launches
(triton.testing.do_bench). Needs a CUDA GPU (requires = ["gpu"])."""

import json
import os
import pathlib
import sys

import torch
import triton.testing

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from gpu.decode import decode_step  # noqa: E402
from kernel.tiling import blocks  # noqa: E402

HEADS, DK, DV = 2048, 128, 128

out = pathlib.Path(os.environ["INFRAOPS_OUT"])
generator = torch.Generator(device="cuda").manual_seed(int(os.environ.get("INFRAOPS_SEED", "0")))


def normal(*shape):
    return torch.randn(shape, device="cuda", generator=generator)


q, k, x, v = normal(HEADS, DK), normal(HEADS, DK), normal(HEADS, DK), normal(HEADS, DV)
w = normal(DK, DK) / DK**0.5
state = torch.zeros((HEADS, DK, DV), device="cuda")
result = torch.empty((HEADS, DV), device="cuda")
plan = blocks(DV)
ms = triton.testing.do_bench(lambda: decode_step(q, k, x, w, v, state, result, plan),
                             warmup=50, rep=300)
(out / "metrics.jsonl").write_text(
    json.dumps({"name": "decode_us", "value": ms * 1000, "unit": "us"}) + "\n")
