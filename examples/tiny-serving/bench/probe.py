"""Probe: per-request latency of the engine at the configured batch size."""

import json
import os
import pathlib
import sys
import time
import tomllib

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from serving.engine import serve  # noqa: E402

REQUESTS = 400

config = tomllib.loads(pathlib.Path("config/serving.toml").read_text())
batch = int(config["batch_size"])
serve(32, batch)  # warm-up
start = time.perf_counter()
serve(REQUESTS, batch)
elapsed_ms = (time.perf_counter() - start) * 1000
out = pathlib.Path(os.environ["INFRAOPS_OUT"])
with (out / "metrics.jsonl").open("a") as metrics:
    metrics.write(json.dumps({"name": "latency_ms", "value": elapsed_ms / REQUESTS,
                              "unit": "ms", "labels": {"batch_size": batch}}) + "\n")
print(f"batch_size={batch} latency={elapsed_ms / REQUESTS:.4f} ms/request")
