"""Numerics probe: how far the context-parallel merge drifts from the sequential path, as a
metric a goal can lower. Per context length, the largest relative error over the trials
(`rel_error`, one case per length, with its size as a label, so the feedback draws the
error-versus-length curve), and the largest of them all (`max_rel_error`)."""

import json
import os
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from bench.cp_inputs import LENGTHS, SHARD, TRIALS, inputs  # noqa: E402
from kda.merge import context_parallel, sequential  # noqa: E402

out = pathlib.Path(os.environ["INFRAOPS_OUT"])
seed = int(os.environ.get("INFRAOPS_SEED", "0"))
worst = 0.0
with (out / "metrics.jsonl").open("w") as metrics:
    for length in LENGTHS:
        error = 0.0
        for trial in range(TRIALS):
            q, h, s0 = inputs(seed, length, trial)
            reference = sequential(q.astype(np.float64), h.astype(np.float64),
                                   s0.astype(np.float64))
            merged = context_parallel(q, h, s0, SHARD).astype(np.float64)
            error = max(error, float(np.max(np.abs(merged - reference))
                                     / np.max(np.abs(reference))))
        worst = max(worst, error)
        metrics.write(json.dumps({"name": "rel_error", "value": error, "unit": "ratio",
                                  "case": f"len-{length}", "labels": {"size": length}}) + "\n")
    metrics.write(json.dumps({"name": "max_rel_error", "value": worst, "unit": "ratio"}) + "\n")
