"""Performance probe: microseconds per decode step; a trace of the first steps' phases."""

import contextlib
import json
import os
import pathlib
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from kernel.decode import decode_step  # noqa: E402

DK, DV, STEPS, TRACED = 64, 64, 3000, 20


class Tracer:
    def __init__(self):
        self.events, self.origin = [], time.perf_counter()

    @contextlib.contextmanager
    def span(self, name):
        start = time.perf_counter()
        yield
        self.events.append({"name": name, "ph": "X", "pid": 1, "tid": 1,
                            "ts": (start - self.origin) * 1e6,
                            "dur": (time.perf_counter() - start) * 1e6})


out = pathlib.Path(os.environ["INFRAOPS_OUT"])
rng = np.random.default_rng(int(os.environ.get("INFRAOPS_SEED", "0")))
q, k, g = (rng.standard_normal(DK).astype(np.float32) for _ in range(3))
v = rng.standard_normal(DV).astype(np.float32)
state = np.zeros((DK, DV), dtype=np.float32)
tracer = Tracer()
for _ in range(TRACED):
    decode_step(q, k, v, g, state, tracer)
for _ in range(200):  # warm-up
    decode_step(q, k, v, g, state)
started = time.perf_counter()
for _ in range(STEPS):
    decode_step(q, k, v, g, state)
per_step = (time.perf_counter() - started) / STEPS * 1e6
(out / "metrics.jsonl").write_text(
    json.dumps({"name": "decode_us", "value": per_step, "unit": "us"}) + "\n")
(out / "trace.json").write_text(json.dumps({"traceEvents": tracer.events}))
