"""Probe: per-request latency of the engine at the configured batch size.

The engine is one thread of pure CPU work, so its latency on a core of its own is the CPU time
its thread takes: that is what is timed (time.thread_time), not the wall clock, in which every
other process of a busy machine would count. On a 2-core machine running three other busy
processes, wall-clock executions of one configuration spread by half their median (CV 50%);
CPU time spreads by a few per cent, loaded or not. The thread's clock, not the process's: the
sandbox sets a CPU-time limit (RLIMIT_CPU), and with one this kernel's process CPU clock
advances in 4 ms ticks (a 40-request round read 0.0 or 4.0 ms), while the thread's stays
exact."""

import json
import os
import pathlib
import sys
import time
import tomllib

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from serving.engine import serve  # noqa: E402

REQUESTS = 400
ROUNDS = 10  # timed apart; the fastest is reported

config = tomllib.loads(pathlib.Path("config/serving.toml").read_text())
batch = int(config["batch_size"])
serve(32, batch)  # warm-up
# CPU time still grows when another process thrashes the core's caches: a stall only ever
# adds time, so of ten rounds of 40 requests the fastest is the engine's cost. (Timed as one
# round of 400 on the process's clock, batch size 8 took 3 or 4 ticks, and once failed to show
# its 48% gain with 95% confidence in a loaded CI run.)
per_round = REQUESTS // ROUNDS
best_ms = float("inf")
for _ in range(ROUNDS):
    start = time.thread_time()
    serve(per_round, batch)
    best_ms = min(best_ms, (time.thread_time() - start) * 1000 / per_round)
out = pathlib.Path(os.environ["INFRAOPS_OUT"])
with (out / "metrics.jsonl").open("a") as metrics:
    metrics.write(json.dumps({"name": "latency_ms", "value": best_ms,
                              "unit": "ms", "labels": {"batch_size": batch}}) + "\n")
print(f"batch_size={batch} latency={best_ms:.4f} ms/request")
