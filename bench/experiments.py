"""Experiment environment figures (issue 3). Prints `figure: <name> <value> <unit>` lines.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres REDIS_URL=redis://127.0.0.1:6379/10 \
        .venv/bin/python bench/experiments.py [--smoke] [--database infraops_bench]

It creates (and drops) its own database (--database, `infraops_bench` unless told) on
DATABASE_URL's server, empties REDIS_URL's Redis database, starts one real Celery worker, and
measures:

- dispatch_overhead_p95_ms: request committed -> the worker holds the claim, idle worker;
- wall_ratio_1s_probe: an experiment of a 1 s probe (baseline + candidate) through the whole
  system, request to finish, over the same probe command run directly twice right after it;
  both over 12 experiments after one warm-up experiment (this process's first request opens
  its broker connection; the worker's first task its database connection);
- sandbox_start_median_ms: one sandboxed `true`;
- ingest_samples_per_s: samples stored through the COPY path.
Targets (issue 3): <= 50, <= 1.03, <= 15, >= 50000.

--smoke: 3 experiments of a 0.1 s probe (the figures keep their names), 3 sandbox starts,
5,000 samples: seconds, to show that it runs, not how fast.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench import database_create, database_drop  # noqa: E402

BENCH_DB = "infraops_bench"
PROBE_SCRIPT = """import json, os, time
time.sleep(SECONDS)
with open(os.environ["INFRAOPS_OUT"] + "/metrics.jsonl", "w") as out:
    out.write(json.dumps({"name": "latency_ms", "value": 1.0}) + "\\n")
"""
PROBE = "python3 bench/sleep_probe.py"


@dataclass(frozen=True)
class Size:
    experiments: int  # the first is the warm-up: only dispatch_overhead_first_ms reports it
    probe_seconds: float
    sandbox_starts: int
    samples: int


FULL = Size(experiments=13, probe_seconds=1.0, sandbox_starts=30, samples=200_000)
SMOKE = Size(experiments=3, probe_seconds=0.1, sandbox_starts=3, samples=5_000)


def figure(name: str, value: float, unit: str) -> None:
    print(f"figure: {name} {value:.4g} {unit}", flush=True)


def setup(database: str) -> Path:
    data = Path(tempfile.mkdtemp(prefix="infraops-bench-"))
    data.chmod(0o755)
    os.environ["DATABASE_URL"] = database_create(database)
    os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/10")
    os.environ["INFRAOPS_DATA"] = str(data)
    os.environ["DJANGO_SETTINGS_MODULE"] = "infraops.project.settings"
    # Outside DEBUG the settings refuse to start without a key; the bench signs nothing.
    os.environ.setdefault("SECRET_KEY", "bench-" + os.urandom(16).hex())
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    import redis

    redis.Redis.from_url(os.environ["REDIS_URL"]).flushdb()
    return data


def make_target(data: Path, size: Size):  # type: ignore[no-untyped-def]
    from infraops import gitops
    from infraops.services.targets import target_register

    source = data / "src"
    shutil.copytree(ROOT / "examples" / "tiny-serving", source)
    manifest = (source / "infraops.toml").read_text()
    (source / "bench" / "sleep_probe.py").write_text(
        PROBE_SCRIPT.replace("SECONDS", str(size.probe_seconds)))
    manifest = manifest.replace("python3 bench/probe.py", PROBE)
    manifest = manifest.replace("repeat = 5", "repeat = 1")
    (source / "infraops.toml").write_text(manifest)
    origin = data / "origin.git"
    gitops.repo_init_from_dir(source, origin, branch="main", message="bench")
    return target_register(name="bench", repo_url=str(origin), base_branch="main",
                           trusted_roots=[data])


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


def start_worker(data: Path) -> subprocess.Popen[bytes]:
    log = (data / "worker.log").open("wb")
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "infraops.project", "worker", "-Q", "experiments",
         "-c", "1", "-n", f"bench-{os.getpid()}@%h", "--loglevel", "WARNING"],
        cwd=ROOT, env=os.environ.copy(), stdout=log, stderr=subprocess.STDOUT)
    from infraops.experiments.workers import live_queues

    deadline = time.monotonic() + 60
    while "experiments" not in (live_queues() or set()):
        if time.monotonic() > deadline or worker.poll() is not None:
            raise SystemExit(f"the bench worker did not start: see {data / 'worker.log'}")
        time.sleep(0.2)
    return worker


def wait_finished(pk: int, timeout: float = 120):  # type: ignore[no-untyped-def]
    from infraops.models import Experiment

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        experiment = Experiment.objects.get(pk=pk)
        if experiment.is_finished:
            return experiment
        time.sleep(0.05)  # the figures come from the worker's timestamps, not from this poll
    raise SystemExit(f"experiment {pk} did not finish in {timeout} s")


def bench_dispatch_and_wall(target, size: Size) -> None:  # type: ignore[no-untyped-def]
    from infraops.experiments.services import experiment_request

    base = target.manifest_commit
    dispatch: list[float] = []
    ratios: list[float] = []
    overheads: list[float] = []
    directs: list[float] = []
    with DirectProbe(size.probe_seconds) as direct:
        for n in range(size.experiments):
            sha = candidate(target, n)
            experiment = experiment_request(target=target, candidate_commit=sha,
                                            baseline_commit=base)
            done = wait_finished(experiment.pk)
            assert done.status == "succeeded", done.failure_reason
            # Paired: the same two runs made directly right after, so drift cancels out.
            both = direct.run() + direct.run()
            directs.append(both / 2)
            dispatch.append((done.started_at - done.created_at).total_seconds() * 1000)
            ratios.append((done.finished_at - done.created_at).total_seconds() / both)
            walls = sum(done.executions.values_list("wall_seconds", flat=True))
            overheads.append(((done.finished_at - done.started_at).total_seconds() - walls) * 1000)
    first = dispatch.pop(0)  # the warm-up experiment, reported on its own
    del ratios[0], overheads[0], directs[0]
    figure("dispatch_overhead_p95_ms", statistics.quantiles(dispatch, n=20)[-1], "ms")
    figure("dispatch_overhead_median_ms", statistics.median(dispatch), "ms")
    figure("dispatch_overhead_first_ms", first, "ms")
    figure("wall_ratio_1s_probe", statistics.median(ratios), "ratio")
    # Where the rest goes: time in the worker beyond the sandboxed runs themselves.
    figure("worker_overhead_median_ms", statistics.median(overheads), "ms")
    figure("probe_direct_s", statistics.median(directs), "s")


class DirectProbe:
    """The bench probe run directly: no sandbox, no worker, no database."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __enter__(self) -> DirectProbe:
        self.out = Path(tempfile.mkdtemp())
        self.script = self.out / "sleep_probe.py"
        self.script.write_text(PROBE_SCRIPT.replace("SECONDS", str(self.seconds)))
        return self

    def run(self) -> float:
        started = time.perf_counter()
        subprocess.run(["/usr/bin/python3", str(self.script)],
                       env=os.environ | {"INFRAOPS_OUT": str(self.out)}, check=True)
        return time.perf_counter() - started

    def __exit__(self, *exc: object) -> None:
        shutil.rmtree(self.out)


def bench_sandbox_start(data: Path, size: Size) -> None:
    from infraops.experiments import sandbox

    work, out = data / "sb-work", data / "sb-out"
    identity = sandbox.sandbox_identity()
    for path in (work, out):
        sandbox.sandbox_prepare_dir(path, identity)
    spec = sandbox.SandboxSpec(command="true", workdir=work, out_dir=out, env={})
    sandbox.sandbox_run(spec, identity=identity)
    runs = []
    for _ in range(size.sandbox_starts):
        started = time.perf_counter()
        sandbox.sandbox_run(spec, identity=identity)
        runs.append((time.perf_counter() - started) * 1000)
    figure("sandbox_start_median_ms", statistics.median(runs), "ms")


def bench_ingest(target, size: Size) -> None:  # type: ignore[no-untyped-def]
    from infraops.experiments.results import MetricRow, samples_copy
    from infraops.models import Experiment, ProbeExecution, Sample

    experiment = Experiment.objects.create(target=target, candidate_commit="0" * 40,
                                           baseline_commit="0" * 40)
    execution = ProbeExecution.objects.create(experiment=experiment, attempt=1, probe="p",
                                              side="candidate", repeat_index=0, reason="ok",
                                              wall_seconds=0)
    rows = [MetricRow(name="latency_ms", value=float(i), unit="ms", case=f"case-{i % 97}",
                      labels={"i": i}) for i in range(size.samples)]
    started = time.perf_counter()
    stored = samples_copy(execution, rows)
    elapsed = time.perf_counter() - started
    assert Sample.objects.filter(execution=execution).count() == stored == len(rows)
    figure("ingest_samples_per_s", stored / elapsed, "samples/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true",
                        help="a tiny run (seconds): it runs, the figures mean nothing")
    parser.add_argument("--database", default=BENCH_DB,
                        help="the database to create (and drop) on DATABASE_URL's server")
    args = parser.parse_args()
    size = SMOKE if args.smoke else FULL
    data = setup(args.database)
    worker = None
    try:
        target = make_target(data, size)
        bench_sandbox_start(data, size)
        worker = start_worker(data)
        bench_dispatch_and_wall(target, size)
        # Last: 200 000 new rows set off autovacuum, which would run beside the experiments.
        bench_ingest(target, size)
    finally:
        if worker is not None:
            worker.terminate()
            worker.wait(timeout=30)
        from django.db import connections

        connections.close_all()
        database_drop(args.database)
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
