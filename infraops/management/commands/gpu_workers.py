"""manage.py gpu_workers: on a GPU host, one Celery worker per GPU.

Each worker sees one GPU (CUDA_VISIBLE_DEVICES=N; its probes get /dev/nvidiaN and the control
nodes only: infraops.experiments.accelerators.own_gpus), runs one experiment at a time
(concurrency 1: two probes on one GPU would measure each other) and consumes the queues of
what the GPU can serve: experiments.gpu, and experiments.gpu.<model> (e.g. experiments.gpu.h200)
for probes that `requires = ["gpu", "h200"]`. A worker that dies is started again; SIGTERM or
Ctrl-C stops them all (each finishes its experiment first: Celery's warm shutdown).

On a host other than the web's, set INFRAOPS_WEB_URL and INFRAOPS_WORKER_TOKEN (and
DATABASE_URL, REDIS_URL): the workers then fetch commits and move blobs over HTTP
(docs/deploy.md).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from types import FrameType
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from infraops.experiments.remote import accelerators, model_queue_name

RESTART_PAUSE = 5.0  # seconds between a worker's death and its restart


@dataclass(frozen=True)
class GpuWorker:
    """One worker's command line and environment."""

    index: int
    name: str
    queues: tuple[str, ...]
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]


def gpu_queues(model: str) -> tuple[str, ...]:
    """What a worker with a GPU of `model` consumes (the names infraops.experiments.services.
    queue_for gives probes that require "gpu", or "gpu" and the model)."""
    word = model_queue_name(model)
    queues = ["experiments.gpu"]
    if word and word != "gpu":
        queues.append("experiments." + ".".join(sorted({"gpu", word})))
    return tuple(queues)


def plan(gpus: list[dict[str, Any]], *, host: str, extra_queues: list[str]) -> list[GpuWorker]:
    """A worker per GPU of `gpus` (nvidia-smi's report, infraops.experiments.remote)."""
    workers = []
    for gpu in gpus:
        index = int(gpu["index"])
        queues = (*gpu_queues(str(gpu["model"])), *extra_queues)
        name = f"gpu{index}@{host}"
        argv = (sys.executable, "-m", "celery", "-A", "infraops.project", "worker",
                "-Q", ",".join(queues), "-c", "1", "-n", name, "--prefetch-multiplier", "1",
                "--loglevel", "INFO")
        workers.append(GpuWorker(index, name, queues, argv,
                                 (("CUDA_VISIBLE_DEVICES", str(index)),)))
    return workers


class Command(BaseCommand):
    help = "One Celery worker per GPU of this host (CUDA_VISIBLE_DEVICES each, concurrency 1)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--queues", default="",
                            help="More queues every worker consumes, comma-separated.")
        parser.add_argument("--print", action="store_true", dest="print_only",
                            help="Print each worker's command line and start nothing.")

    def handle(self, *args: Any, **options: Any) -> None:
        visible = os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        gpus = accelerators()
        if visible is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = visible
            shown = {v.strip() for v in visible.split(",")}
            gpus = [gpu for gpu in gpus if str(gpu["index"]) in shown]
        if not gpus:
            raise CommandError("No GPU found: nvidia-smi is missing, fails, or lists none "
                               "(CUDA_VISIBLE_DEVICES may hide them all).")
        extra = [q.strip() for q in options["queues"].split(",") if q.strip()]
        workers = plan(gpus, host=socket.gethostname(), extra_queues=extra)
        for worker in workers:
            env = " ".join(f"{k}={v}" for k, v in worker.env)
            self.stdout.write(f"{worker.name}: {env} {' '.join(worker.argv)}")
        if not options["print_only"]:
            self._supervise(workers)

    def _supervise(self, workers: list[GpuWorker]) -> None:
        stopping = False
        running: dict[int, subprocess.Popen[bytes]] = {}

        def stop(signum: int, frame: FrameType | None) -> None:
            nonlocal stopping
            stopping = True
            for process in running.values():
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        died_at: dict[int, float] = {}
        while True:
            for worker in workers:
                process = running.get(worker.index)
                if stopping or (process is not None and process.poll() is None):
                    continue
                if process is not None:
                    died_at.setdefault(worker.index, time.monotonic())
                    if time.monotonic() - died_at[worker.index] < RESTART_PAUSE:
                        continue
                    self.stderr.write(f"{worker.name} ended ({process.returncode}): starting "
                                      "it again")
                died_at.pop(worker.index, None)
                running[worker.index] = subprocess.Popen(  # nosec B603
                    worker.argv, env={**os.environ, **dict(worker.env)})
            if stopping:
                for process in running.values():
                    process.wait()
                return
            time.sleep(1.0)
