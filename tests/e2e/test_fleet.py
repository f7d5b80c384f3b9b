"""Workers on other hosts, proved on one machine: the web, an agent worker beside it (with
beat) and two remote experiment workers, each in a mount namespace of its own with its own data
folder and the web's folder hidden from it, talking to PostgreSQL, Redis and the web over TCP
only. A tuner run completes with every experiment on the remote workers; one of them is killed
with SIGKILL mid-experiment (a host that loses power) and the other finishes its experiment,
recorded once.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from django.conf import settings
from django.contrib.auth.models import User

from agents.models import AgentRun
from agents.services import run_start
from bench.fleet import RemoteWorker, start_remote_worker, start_web
from infraops.experiments.fleet import worker_register
from infraops.models import Experiment, Target
from infraops.services.targets import target_register
from tests.conftest import make_origin
from tests.e2e.conftest import stop_processes, system_env
from tests.factories import GoalFactory
from tests.infraops.test_reliability import (  # noqa: F401  (fixtures)
    PROBE_TABLE,
    QUICK_PROBE,
    broker,
    recorded_once,
)
from tests.infraops.workers_harness import Workers, holder_pid, started_workers, wait_until

pytestmark = pytest.mark.e2e

PROBE_SECONDS = 3.0  # long enough to be caught mid-experiment
KNOB = """
[[knob]]
name = "batch_size"
file = "config/serving.toml"
pattern = '(?m)^batch_size = (\\d+)$'
values = ["1", "4", "16"]
"""


@pytest.fixture
def fleet_target(transactional_db: None, example_source: Path, tmp_path: Path) -> Target:
    (example_source / "bench" / "quick.py").write_text(QUICK_PROBE)
    manifest = PROBE_TABLE.format(name="latency-bench", seconds=PROBE_SECONDS, cost=1,
                                  requires="") + KNOB
    (example_source / "infraops.toml").write_text(manifest)
    target = target_register(name="fleet", repo_url=str(make_origin(tmp_path, example_source)),
                             base_branch="main")
    assert target.manifest() is not None, target.manifest_errors
    return target


@pytest.fixture
def local(data_dir: Path, tmp_path: Path, broker: str) -> Iterator[Workers]:  # noqa: F811
    with started_workers(data_dir, tmp_path, broker) as started:
        yield started


def test_a_tuner_run_completes_on_remote_workers_and_survives_one_host_lost(
    local: Workers, fleet_target: Target, engineer: User, data_dir: Path, broker: str,  # noqa: F811
) -> None:
    admin = User.objects.create_superuser("fleet-admin", password="x" * 20)
    env = system_env(data_dir) | {"REDIS_URL": broker, "SECRET_KEY": settings.SECRET_KEY}
    web_url, web = start_web(env, data_dir.parent / f"{data_dir.name}-web.log")
    remotes: list[RemoteWorker] = []
    try:
        # The agent's steps (and beat, whose reaper re-queues a lost host's experiment) on the
        # web's host; experiments only on the remote workers.
        local.start(["agent"], concurrency=1, label="agent",
                    extra=["-B", "-s", str(data_dir / "celerybeat-schedule")])
        for name in ("remote-a", "remote-b"):
            _, token = worker_register(name=name, queues=["experiments"], by=admin)
            # A 15 s lease: the lost host's experiment waits at most that and the reaper's
            # 30 s before another worker takes it (60 s by default).
            remotes.append(start_remote_worker(
                name, env=env | {"INFRAOPS_EXPERIMENT_LEASE_SECONDS": "15"}, web_url=web_url,
                token=token, hide=[data_dir]))
        wait_until(lambda: all(
            (r.data / "view.txt").exists() and "ready" in _log(r) for r in remotes),
            timeout=120, interval=0.5, what="both remote workers ready")
        for remote in remotes:
            # Seen from inside its namespace, the web's data folder is empty: no repos/, no blobs/.
            assert remote.saw_nothing_of([data_dir]), remote.view()
            assert (data_dir / "repos").is_dir()  # while the web has them

        goal = GoalFactory.create(target=fleet_target, name="fleet", owner=engineer,
                                  boundary__editable_paths="config/**",
                                  boundary__max_experiments=4, snapshot_by=engineer)
        run = run_start(goal=goal, user=engineer)

        # A host lost mid-experiment: SIGKILL the whole remote worker holding the first one.
        running = wait_until(
            lambda: Experiment.objects.filter(runs=run, status=Experiment.Status.RUNNING).first(),
            timeout=300, interval=0.2, what="an experiment running on a remote worker")
        pids = {remote.name: _pids_of_tree(remote) for remote in remotes}
        victim = next(r for r in remotes if holder_pid(running.claimed_by) in pids[r.name])
        victim.kill()
        survivor = next(r for r in remotes if r is not victim)

        run = wait_until(lambda: _ended(run), timeout=600, interval=1.0,
                         what="the tuner run to end")
        # The probe measures the same constant on every commit: the tuner ends as planned,
        # with nothing to submit.
        assert run.status == AgentRun.Status.FINISHED, run.stop_reason
        assert run.stop_reason == "nothing beat the base"
        experiments = list(Experiment.objects.filter(runs=run))
        assert len(experiments) >= 2
        assert all(e.status == Experiment.Status.SUCCEEDED for e in experiments)
        lost = next(e for e in experiments if e.pk == running.pk)
        assert lost.attempts == 2 and recorded_once(lost)
        # Every experiment ran on a remote worker: the lost one, and all after it, on the
        # survivor.
        survivor_pids = pids[survivor.name] | _pids_of_tree(survivor)
        assert holder_pid(lost.claimed_by) in survivor_pids
        assert {holder_pid(e.claimed_by) for e in experiments} <= (
            survivor_pids | pids[victim.name])
        # The commits travelled by git over HTTP into each host's own cache, the outputs back
        # into the web's blob store.
        assert (survivor.data / "cache" / f"target-{fleet_target.pk}.git").is_dir()
        assert not (survivor.data / "repos").exists()
        assert "/fleet/git/target-" in (data_dir.parent / f"{data_dir.name}-web.log").read_text()
    finally:
        for remote in remotes:
            remote.stop()
        stop_processes([web])
        for remote in remotes:
            print(f"--- {remote.name} log (tail) ---\n{_log(remote)[-3000:]}")
            shutil.rmtree(remote.data, ignore_errors=True)


def _log(remote: RemoteWorker) -> str:
    path = remote.data / "worker.log"
    return path.read_text(errors="replace") if path.exists() else ""


def _pids_of_tree(remote: RemoteWorker) -> set[int]:
    try:
        main = psutil.Process(remote.process.pid)
        return {main.pid, *(child.pid for child in main.children(recursive=True))}
    except psutil.NoSuchProcess:
        return set()


def _ended(run: AgentRun) -> AgentRun | None:
    run.refresh_from_db()
    return run if run.status != AgentRun.Status.RUNNING else None

