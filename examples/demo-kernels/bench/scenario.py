"""Behaviour probe: prefill steps alone, or with a KV transfer alongside (SCENARIO).

Writes step_ms per step and a Chrome trace of the main thread's phases and the transfer
thread's submissions.
"""

import contextlib
import json
import os
import pathlib
import sys
import threading
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from engine import ep  # noqa: E402
from engine.kv import Transfer  # noqa: E402

STEPS, CHUNKS = 30, 12


class Tracer:
    def __init__(self):
        self.events = []
        self.origin = time.perf_counter()
        self.lock = threading.Lock()

    @contextlib.contextmanager
    def span(self, name):
        start = time.perf_counter()
        try:
            yield
        finally:
            end = time.perf_counter()
            with self.lock:
                self.events.append({
                    "name": name, "ph": "X", "pid": 1, "tid": threading.get_ident() % 100000,
                    "ts": (start - self.origin) * 1e6, "dur": (end - start) * 1e6})

    def dump(self, path):
        names = [{"name": "thread_name", "ph": "M", "pid": 1, "tid": t.ident % 100000,
                  "args": {"name": t.name}} for t in threading.enumerate()]
        path.write_text(json.dumps({"traceEvents": names + self.events}))


out = pathlib.Path(os.environ["INFRAOPS_OUT"])
with_kv = os.environ.get("SCENARIO") == "prefill_kv"
tracer = Tracer()
transfer = Transfer(tracer) if with_kv else None
ep.wait_for_gpu(0.1)  # calibrate outside the measured steps
with (out / "metrics.jsonl").open("w") as metrics:
    for _ in range(STEPS):
        started = time.perf_counter()
        done = transfer.send(CHUNKS) if transfer else None
        with tracer.span("compute"):
            time.sleep(0.003)  # the GPU computes; the CPU is free
        with tracer.span("dispatch"):
            ep.dispatch()
        with tracer.span("combine"):
            ep.combine()
        if done is not None:
            with tracer.span("wait_kv"):
                done.wait()
        step_ms = (time.perf_counter() - started) * 1000
        metrics.write(json.dumps({"name": "step_ms", "value": step_ms, "unit": "ms"}) + "\n")
tracer.dump(out / "trace.json")
