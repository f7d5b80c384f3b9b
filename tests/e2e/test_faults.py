"""Faults through the real processes: a Redis outage, a SIGKILLed worker and terminated
PostgreSQL backends, each during an LLM run whose model (the local stub) takes a few seconds
a step, so the fault lands mid-step.

Each test has its own redis-server on a free port (the machine's shared Redis is never
touched), its own worker (with beat, as `manage.py standalone` runs it) and web process.
Deadlines are generous (a loaded 2-core machine): the tests assert that the system recovers,
never how fast; bench/faults.py prints how long it took (INFRAOPS_FAULT_FIGURES).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection
from playwright.sync_api import Page, expect

from agents.models import AgentRun
from agents.scripted.endpoint import OpenAIStub, ReceivedRequest, StubReply, completion
from infraops.models import Boundary, Goal, Target
from tests.e2e.conftest import _wait_for, free_port, system_env

pytestmark = [pytest.mark.e2e, pytest.mark.browser]
API_KEY = "sk-e2e-faults-000111222333"
STEP_SECONDS = 2.5  # what the model takes to answer, each step
APP_NAME = "infraops-faults-worker"  # the worker's PostgreSQL application_name
REDIS = shutil.which("redis-server") or "/usr/bin/redis-server"


def figure(name: str, value: float, unit: str) -> None:
    """Hand a measurement to bench/faults.py (and say it in the test's output)."""
    sys.stdout.write(f"figure: {name} {value:.1f} {unit}\n")
    path = os.environ.get("INFRAOPS_FAULT_FIGURES")
    if path:
        with open(path, "a") as handle:
            handle.write(json.dumps({"name": name, "value": value, "unit": unit}) + "\n")


def wait_for(what: str, check: Callable[[], Any], timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


class FaultySystem:
    """Redis, a worker and the web as processes this test owns, and the faults to inflict."""

    def __init__(self, tmp: Path, env: dict[str, str]) -> None:
        self.tmp = tmp
        self.redis_port = free_port()
        self.web_port = free_port()
        self.base = f"http://127.0.0.1:{self.web_port}"
        self.env = env | {"REDIS_URL": f"redis://127.0.0.1:{self.redis_port}/0",
                          "PGAPPNAME": APP_NAME}
        self.redis: subprocess.Popen[bytes] | None = None
        self.worker: subprocess.Popen[bytes] | None = None
        self.web: subprocess.Popen[bytes] | None = None
        self.worker_starts = 0

    def start_redis(self) -> None:
        log = (self.tmp / "redis.log").open("ab")
        self.redis = subprocess.Popen(
            [REDIS, "--port", str(self.redis_port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.tmp)], stdout=log, stderr=subprocess.STDOUT)
        wait_for("redis to answer", self._redis_answers, 30)

    def _redis_answers(self) -> bool:
        import redis

        try:
            return bool(redis.Redis(port=self.redis_port, socket_timeout=1).ping())
        except redis.RedisError:
            return False

    def stop_redis(self) -> None:
        assert self.redis is not None
        self.redis.kill()  # an outage, not a shutdown: nothing is saved, nothing is told
        self.redis.wait(timeout=20)
        self.redis = None

    def start_worker(self) -> None:
        self.worker_starts += 1
        log = (self.tmp / "worker.log").open("ab")
        self.worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "infraops.project", "worker", "-Q",
             "agent,experiments", "-c", "2", "--loglevel", "INFO", "-B", "-s",
             str(self.tmp / "celerybeat-schedule"), "-n", f"faults-{self.web_port}@%h"],
            env=self.env, cwd=settings.BASE_DIR, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)
        wait_for("the worker to be ready", lambda: self.worker_log().count(" ready.")
                 >= self.worker_starts, 90)

    def worker_tree(self) -> list[psutil.Process]:
        assert self.worker is not None
        root = psutil.Process(self.worker.pid)
        return [root, *root.children(recursive=True)]

    def kill_worker(self) -> list[psutil.Process]:
        """SIGKILL the worker's whole process group (main, pool, beat); its tree before."""
        assert self.worker is not None
        tree = self.worker_tree()
        os.killpg(self.worker.pid, signal.SIGKILL)
        self.worker.wait(timeout=20)
        self.worker = None
        return tree

    def start_web(self) -> None:
        log = (self.tmp / "web.log").open("ab")
        self.web = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "infraops.project.asgi:application", "--host",
             "127.0.0.1", "--port", str(self.web_port)],
            env=self.env, cwd=settings.BASE_DIR, stdout=log, stderr=subprocess.STDOUT)
        _wait_for(f"{self.base}/healthz", [self.web])

    def worker_log(self) -> str:
        path = self.tmp / "worker.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def close(self) -> None:
        for process in (self.web, self.worker):
            if process is not None and process.poll() is None:
                process.terminate()
        for process in (self.web, self.worker):
            if process is None:
                continue
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                if process is self.worker:
                    os.killpg(process.pid, signal.SIGKILL)  # its own group: pool and beat too
                else:
                    process.kill()
        if self.redis is not None:
            self.redis.kill()
            self.redis.wait(timeout=20)
        for name in ("worker", "web"):
            path = self.tmp / f"{name}.log"
            if path.exists():
                sys.stdout.write(f"--- {name} log (tail) ---\n")
                sys.stdout.write(path.read_text(errors="replace")[-4000:])


def slow_model(stub: OpenAIStub) -> None:
    """Every request answers, after STEP_SECONDS, with a harmless read of one of three files
    in turn (never the same action three times in a row, which pauses a run): endless."""
    paths = itertools.cycle(["config/serving.toml", "infraops.toml", "bench/probe.py"])

    def answer(request: ReceivedRequest) -> StubReply:
        stub.push(answer)
        reply = completion(tool_calls=[("read_file", json.dumps({"path": next(paths)}))])
        return StubReply(body=reply.body, delay=STEP_SECONDS)

    stub.push(answer)


@pytest.fixture
def stub() -> Iterator[OpenAIStub]:
    with OpenAIStub() as server:
        slow_model(server)
        yield server


@pytest.fixture
def system(transactional_db: None, data_dir: Path, tmp_path: Path,
           stub: OpenAIStub) -> Iterator[FaultySystem]:
    env = system_env(data_dir) | {"OPENAI_BASE_URL": stub.base_url, "OPENAI_API_KEY": API_KEY,
                                  "INFRAOPS_MODEL": "stub-model"}
    faulty = FaultySystem(tmp_path, env)
    try:
        faulty.start_redis()
        faulty.start_worker()
        faulty.start_web()
        yield faulty
    finally:
        faulty.close()


@pytest.fixture
def llm_goal(example_target: Target, engineer: User) -> Goal:
    goal = Goal.objects.create(target=example_target, name="faults", probe="latency-bench",
                               metric="latency_ms", policy=Goal.Policy.LLM, owner=engineer)
    Boundary.objects.create(goal=goal, editable_paths="config/**", max_steps=500)
    return goal


def start_run(page: Page, system: FaultySystem, goal: Goal, user: User) -> AgentRun:
    page.goto(f"{system.base}/accounts/login/")
    page.get_by_label("Username").fill(user.username)
    page.get_by_label("Password").fill("correct horse battery")
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("link", name="Review queue")).to_be_visible()
    page.goto(f"{system.base}/targets/{goal.target.name}/")
    page.get_by_role("button", name="Start a run").click()
    expect(page).to_have_url(re.compile(r"/runs/\d+/$"), timeout=30_000)
    return AgentRun.objects.get()


def steps(run: AgentRun) -> int:
    return AgentRun.objects.values_list("step_count", flat=True).get(pk=run.pk)


def thinking(stub: OpenAIStub, before: int) -> bool:
    """A step is waiting on the model (its request arrived after `before` requests)."""
    return len(stub.requests) > before


def running(run: AgentRun) -> bool:
    run.refresh_from_db()
    assert run.status == AgentRun.Status.RUNNING, (run.status, run.stop_reason)
    return True


def test_a_redis_outage_mid_step_keeps_the_worker_and_the_run_and_refuses_new_runs_clearly(
    page: Page, system: FaultySystem, stub: OpenAIStub, llm_goal: Goal, engineer: User,
) -> None:
    run = start_run(page, system, llm_goal, engineer)
    wait_for("two steps", lambda: steps(run) >= 2, 120)
    assert system.worker is not None
    pid = system.worker.pid
    asked = len(stub.requests)
    wait_for("a step waiting on the model", lambda: thinking(stub, asked), 60)
    system.stop_redis()
    down_at = time.monotonic()

    # A run started now is refused with the reason, and nothing of it is left behind.
    page.goto(f"{system.base}/targets/{llm_goal.target.name}/")
    # The first run is active on the goal, so the page offers another one knowingly.
    page.get_by_role("button", name="Start another run").click()
    expect(page.get_by_text(re.compile(
        r"the task queue \(Redis\) is not answering; nothing was started", re.I))).to_be_visible(
        timeout=30_000)
    assert AgentRun.objects.count() == 1

    time.sleep(max(0.0, 30 - (time.monotonic() - down_at)))
    assert system.worker.poll() is None, "the worker exited during the outage"
    at_return = steps(run)
    system.start_redis()
    back_at = time.monotonic()
    wait_for("a step after Redis returned", lambda: steps(run) > at_return, 240)
    figure("redis_outage_recovery_s", time.monotonic() - back_at, "s")
    wait_for("another step", lambda: steps(run) > at_return + 1, 120)

    assert system.worker.poll() is None and system.worker.pid == pid
    assert running(run)
    assert "Unrecoverable error" not in system.worker_log()
    # And the queue takes new runs again.
    page.goto(f"{system.base}/targets/{llm_goal.target.name}/")
    page.get_by_role("button", name="Start another run").click()
    expect(page).to_have_url(re.compile(r"/runs/\d+/$"), timeout=30_000)
    assert AgentRun.objects.count() == 2


def leftovers(tree: list[psutil.Process]) -> list[str]:
    """Processes of a killed worker's tree still alive (the same process, not a reused pid)."""
    alive = []
    for process in tree:
        try:
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                alive.append(f"{process.pid} {process.username()} {process.cmdline()[:3]}")
        except psutil.Error:
            continue
    return alive


def test_a_worker_killed_mid_step_takes_the_step_again_after_its_restart(
    page: Page, system: FaultySystem, stub: OpenAIStub, llm_goal: Goal, engineer: User,
) -> None:
    run = start_run(page, system, llm_goal, engineer)
    wait_for("two steps", lambda: steps(run) >= 2, 120)
    asked = len(stub.requests)
    wait_for("a step waiting on the model", lambda: thinking(stub, asked), 60)
    tree = system.kill_worker()
    at_kill = steps(run)

    time.sleep(3)
    assert steps(run) == at_kill, "nothing steps while no worker runs"
    deadline = time.monotonic() + 30
    while leftovers(tree) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = leftovers(tree)
    figure("leftover_sandbox_processes_after_kills", len(left), "count")
    assert left == []

    system.start_worker()
    restarted_at = time.monotonic()
    wait_for("the killed step to be taken again", lambda: steps(run) > at_kill, 270)
    figure("worker_kill_recovery_s", time.monotonic() - restarted_at, "s")
    assert running(run)
    assert run.events.filter(message__contains="the worker that had it is gone").exists()


def test_terminated_database_backends_are_replaced_by_the_next_task(
    page: Page, system: FaultySystem, stub: OpenAIStub, llm_goal: Goal, engineer: User,
) -> None:
    run = start_run(page, system, llm_goal, engineer)
    wait_for("two steps", lambda: steps(run) >= 2, 120)
    asked = len(stub.requests)
    wait_for("a step waiting on the model", lambda: thinking(stub, asked), 60)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name = %s", [APP_NAME])
        (terminated,) = cursor.fetchone()
    cut_at = time.monotonic()
    at_cut = steps(run)
    assert terminated >= 1, "the worker had no database connection to terminate"

    wait_for("a step after the backends were terminated", lambda: steps(run) > at_cut, 180)
    figure("pg_terminate_recovery_s", time.monotonic() - cut_at, "s")
    wait_for("another step", lambda: steps(run) > at_cut + 1, 120)
    assert running(run)
    assert system.worker is not None and system.worker.poll() is None
