"""Real Celery workers for reliability tests: started as subprocesses on the test database and
a Redis database of their own, inspected and killed through their process tree (psutil).

Only processes started here are ever signalled: a pid is killed only when it belongs to the
tree of a worker this harness started.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import redis
from django.conf import settings

from infraops.experiments.workers import PREFIX
from tests.e2e.conftest import system_env

# Kombu sweeps its unacked messages back to the queue with these options; the worker's own
# visibility timeout is replaced only in the wrapper below, never through product settings.
_WRAPPED_WORKER = """
import sys
from infraops.project.celery import app
app.conf.broker_transport_options = {
    "visibility_timeout": float(sys.argv[1]),
    "unacked_restore_interval": 1,
    "unacked_restore_throttle": 1,
}
app.worker_main(["worker", *sys.argv[2:]])
"""


class TimedOut(RuntimeError):
    """A bounded wait ran out. Not an AssertionError, so that a strict xfail about a product
    bug does not pass for a hung worker."""


def wait_until(predicate: Callable[[], Any], *, timeout: float, interval: float = 0.1,
               what: str = "condition") -> Any:
    """Poll `predicate` until it returns something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimedOut(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


@dataclass
class Worker:
    """One `celery worker` subprocess: its name, queues, log and process tree."""

    name: str
    queues: list[str]
    process: subprocess.Popen[bytes]
    log_path: Path
    _log: Any = field(repr=False)

    def tree(self) -> list[psutil.Process]:
        try:
            main = psutil.Process(self.process.pid)
            return [main, *main.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def pids(self) -> set[int]:
        return {p.pid for p in self.tree()}

    def pool_pids(self) -> set[int]:
        """The pool children: the main process's direct children."""
        try:
            return {p.pid for p in psutil.Process(self.process.pid).children()}
        except psutil.NoSuchProcess:
            return set()

    def kill_pool_child(self, pid: int) -> set[psutil.Process] | None:
        """SIGKILL `pid` if, and only if, it is one of this worker's pool children. Returns
        what it was running (its descendants: probe supervisors, sandboxes, git), or None when
        nothing was killed. psutil.Process values, so that a reused pid is not taken for one."""
        if pid not in self.pool_pids():
            return None
        try:
            child = psutil.Process(pid)
            descendants = set(child.children(recursive=True))
            child.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            return None
        return descendants

    def kill_tree(self) -> None:
        """SIGKILL the main process and every descendant, as a crashed machine would."""
        for proc in self.tree():
            with suppress(psutil.NoSuchProcess):
                proc.send_signal(signal.SIGKILL)
        with suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=20)

    def stop(self) -> None:
        """Kill whatever is left of the tree and close the log."""
        if self.process.poll() is None or self.tree():
            self.kill_tree()
        self._log.close()

    def log_text(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def is_ready(self) -> bool:
        """True once the worker announced every queue it consumes (infraops.experiments.workers)."""
        if self.process.poll() is not None:
            raise RuntimeError(f"worker {self.name} exited:\n{self.log_text()[-3000:]}")
        client = redis.Redis.from_url(settings.REDIS_URL)
        return all(client.exists(f"{PREFIX}{queue}:{self.name}") for queue in self.queues)


class Workers:
    """Starts workers for one test and kills all of them at the end."""

    def __init__(self, data_dir: Path, log_dir: Path, redis_url: str) -> None:
        self.data_dir, self.log_dir, self.redis_url = data_dir, log_dir, redis_url
        self.started: list[Worker] = []

    def start(self, queues: list[str], *, concurrency: int, label: str = "rel",
              visibility_timeout: float | None = None, env: dict[str, str] | None = None,
              ready_timeout: float = 60, extra: Sequence[str] = ()) -> Worker:
        name = f"{label}-{uuid.uuid4().hex[:8]}@{socket.gethostname()}"
        args = ["-Q", ",".join(queues), "-c", str(concurrency), "-n", name,
                "--loglevel", "INFO", *extra]
        if visibility_timeout is None:
            argv = [sys.executable, "-m", "celery", "-A", "infraops.project", "worker", *args]
        else:
            argv = [sys.executable, "-c", _WRAPPED_WORKER, str(visibility_timeout), *args]
        env = system_env(self.data_dir) | {"REDIS_URL": self.redis_url} | (env or {})
        log_path = self.log_dir / f"{name.split('@')[0]}.log"
        log = log_path.open("wb")
        process = subprocess.Popen(argv, env=env, cwd=settings.BASE_DIR, stdout=log,
                                   stderr=subprocess.STDOUT)
        worker = Worker(name, queues, process, log_path, log)
        self.started.append(worker)
        wait_until(worker.is_ready, timeout=ready_timeout, interval=0.2,
                   what=f"worker {name} to announce {queues}")
        return worker

    def owner_of(self, pid: int) -> Worker | None:
        return next((w for w in self.started if pid in w.pids()), None)

    def stop_all(self) -> None:
        for worker in self.started:
            worker.stop()


@contextmanager
def started_workers(data_dir: Path, log_dir: Path, redis_url: str) -> Iterator[Workers]:
    workers = Workers(data_dir, log_dir, redis_url)
    try:
        yield workers
    finally:
        workers.stop_all()
        for worker in workers.started:
            sys.stdout.write(f"--- worker {worker.name} log (tail) ---\n")
            sys.stdout.write(worker.log_path.read_text(errors="replace")[-1500:] + "\n")


def alive(processes: set[psutil.Process]) -> set[psutil.Process]:
    """The processes of `processes` still running: zombies and reused pids count as gone."""
    running = set()
    for process in processes:
        with suppress(psutil.NoSuchProcess):
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                running.add(process)
    return running


def running_in(folder: Path) -> set[psutil.Process]:
    """Every live process whose command line names `folder` (a test's data folder: probes,
    sandboxes and git commands do; workers do not). It finds what a dead worker's tree lost
    track of, such as a sandbox started after the tree was listed."""
    found = set()
    for process in psutil.process_iter(["cmdline"]):
        with suppress(psutil.Error):
            if (str(folder) in " ".join(process.info["cmdline"] or ())
                    and process.status() != psutil.STATUS_ZOMBIE):
                found.add(process)
    return found


def described(processes: set[psutil.Process]) -> list[str]:
    """One line per process: pid, parent, state, user and command line, for a failure."""
    lines = []
    for process in sorted(processes, key=lambda p: p.pid):
        try:
            with process.oneshot():
                lines.append(f"{process.pid} ppid={process.ppid()} {process.status()} "
                             f"{process.username()} {' '.join(process.cmdline())[:200]}")
        except psutil.Error as error:
            lines.append(f"{process.pid}: {error}")
    return lines


def holder_pid(claimed_by: str) -> int | None:
    """The pid part of Experiment.claimed_by ('host:pid')."""
    _, _, pid = claimed_by.rpartition(":")
    return int(pid) if pid.isdigit() else None
