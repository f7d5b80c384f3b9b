"""GPU probe: the Triton context-parallel merge (gpu/merge.py) at one input_precision (the
PRECISION variant: tf32, tf32x3 or ieee; without it, the code's own setting,
kda.merge.INPUT_PRECISION), per context length, on inputs seeded by INFRAOPS_SEED. With --outputs, the merged state per length, for the compare rules
that hold tf32 and tf32x3 to ieee (gpu-cp-equivalence; without, as gpu-cp-error, the code's
fix would "differ" from its baseline by design); always the relative error against a float64 reference (`rel_error`, a case per length)
and the largest (`max_rel_error`), so the feedback draws each precision's error-versus-length
curve. Needs a CUDA GPU (requires = ["gpu"])."""

import json
import os
import pathlib
import sys
import time

import numpy as np
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from gpu import merge  # noqa: E402
from kda.merge import INPUT_PRECISION  # noqa: E402

TRIALS = 4
LENGTHS = (64, 256, 1024, 4096)

torch.backends.cuda.matmul.allow_tf32 = False  # the float64 reference is plain
out = pathlib.Path(os.environ["INFRAOPS_OUT"])
outputs = "--outputs" in sys.argv[1:]
if outputs:
    (out / "outputs").mkdir(exist_ok=True)
seed = int(os.environ.get("INFRAOPS_SEED", "0"))
precision = os.environ.get("PRECISION") or INPUT_PRECISION
worst = 0.0
with (out / "metrics.jsonl").open("w") as metrics:
    for length in LENGTHS:
        generator = torch.Generator(device="cuda").manual_seed(seed * 100_003 + length)
        shape = (TRIALS, length, merge.D, merge.D)
        # Rotations keep the state's norm, so errors accumulate instead of decaying.
        q64 = torch.linalg.qr(torch.randn(shape, device="cuda", dtype=torch.float64,
                                          generator=generator))[0]
        h64 = 0.01 * torch.randn(shape, device="cuda", dtype=torch.float64, generator=generator)
        s64 = torch.randn((TRIALS, merge.D, merge.D), device="cuda", dtype=torch.float64,
                          generator=generator)
        q, h, s0 = (t.float().contiguous() for t in (q64, h64, s64))
        torch.cuda.synchronize()
        started = time.perf_counter()
        state = merge.context_parallel(q, h, s0, precision)
        torch.cuda.synchronize()
        elapsed = (time.perf_counter() - started) * 1000
        reference = merge.sequential(q64, h64, s64)
        error = float((state.double() - reference).abs().max() / reference.abs().max())
        worst = max(worst, error)
        if outputs:
            np.save(out / "outputs" / f"len-{length}.npy", state.cpu().numpy())
            (out / "outputs" / f"len-{length}.meta.json").write_text(
                json.dumps({"size": length}))
        for name, value, unit in (("rel_error", error, "ratio"), ("wall_ms", elapsed, "ms")):
            metrics.write(json.dumps({"name": name, "value": value, "unit": unit,
                                      "case": f"len-{length}", "labels": {"size": length}})
                          + "\n")
    metrics.write(json.dumps({"name": "max_rel_error", "value": worst, "unit": "ratio"}) + "\n")
