"""KV-cache transfer on its own Python thread (a model of the Mooncake transfer engine)."""

import queue
import threading
import time


class Transfer:
    """Chunks are submitted on a Python thread: the submission needs the GIL, the wire
    time (sleep) does not."""

    def __init__(self, tracer):
        self.tracer = tracer
        self.jobs = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="mooncake", daemon=True)
        self.thread.start()

    def send(self, chunks):
        done = threading.Event()
        self.jobs.put((chunks, done))
        return done

    def _run(self):
        while True:
            chunks, done = self.jobs.get()
            for _ in range(chunks):
                with self.tracer.span("kv_transfer"):
                    descriptor = [i * 3 for i in range(1500)]  # build the request: Python work
                    del descriptor
                time.sleep(0.0004)  # on the wire
            done.set()
