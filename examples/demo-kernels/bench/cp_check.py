"""Correctness probe: the CP path against the non-parallel path, per context length.

CP=on runs the context-parallel merge, CP=off the sequential path, on the same inputs
(seeded by INFRAOPS_SEED). One output per length, with its size in a sidecar file.
"""

import json
import os
import pathlib
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from bench.cp_inputs import LENGTHS, SHARD, TRIALS, inputs  # noqa: E402
from kda.merge import context_parallel, sequential  # noqa: E402

out = pathlib.Path(os.environ["INFRAOPS_OUT"])
(out / "outputs").mkdir(exist_ok=True)
seed = int(os.environ.get("INFRAOPS_SEED", "0"))
cp_on = os.environ.get("CP", "off") == "on"
with (out / "metrics.jsonl").open("w") as metrics:
    for length in LENGTHS:
        states = []
        started = time.perf_counter()
        for trial in range(TRIALS):  # independent inputs: the worst case is a steadier curve
            q, h, s0 = inputs(seed, length, trial)
            states.append(context_parallel(q, h, s0, SHARD) if cp_on else sequential(q, h, s0))
        elapsed = (time.perf_counter() - started) * 1000
        np.save(out / "outputs" / f"len-{length}.npy", np.stack(states).astype(np.float32))
        (out / "outputs" / f"len-{length}.meta.json").write_text(json.dumps({"size": length}))
        metrics.write(json.dumps({"name": "wall_ms", "value": elapsed, "unit": "ms",
                                  "case": f"len-{length}"}) + "\n")
