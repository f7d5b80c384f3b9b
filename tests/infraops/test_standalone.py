"""`manage.py standalone` as a real process: embedded PostgreSQL and Redis in a data folder
(or the servers named by DATABASE_URL / REDIS_URL), web and worker children, a first admin,
the example target, a clean stop on SIGTERM and a second start that reuses the data."""

from __future__ import annotations

import contextlib
import http.cookiejar
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlencode

import psutil
import psycopg
import pytest
import redis
from django.conf import settings
from django.db import connection

from infraops.management.commands.standalone import port_free, worker_commands
from tests.e2e.conftest import free_port
from tests.xdist_workers import spare_redis_url

START_SECONDS = 120
STOP_SECONDS = 25
ADMIN_RE = re.compile(r"Created admin \(engineer\) with password (\S+)")


def fresh_data_folder() -> Path:
    path = Path(tempfile.mkdtemp(prefix="infraops-standalone-"))
    path.chmod(0o755)  # the embedded PostgreSQL runs as its own user and must reach pgdata
    return path


def standalone_env(data: Path, **servers: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "REDIS_URL", "SECRET_KEY")}
    return env | {"INFRAOPS_DATA": str(data), "PYTHONUNBUFFERED": "1"} | servers


@dataclass
class Standalone:
    process: subprocess.Popen[bytes]
    data: Path
    port: int
    log_path: Path
    stopped_in: float | None = None
    leftovers: list[str] = field(default_factory=list)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_until_ready(self) -> None:
        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"standalone exited with {self.process.returncode}:\n{self.log}")
            if "InfraOps is running at" in self.log:
                try:
                    with urllib.request.urlopen(f"{self.base}/healthz", timeout=2) as response:
                        if response.status == 200:
                            return
                except OSError:
                    pass
            time.sleep(0.3)
        pytest.fail(f"standalone did not answer within {START_SECONDS} s:\n{self.log[-4000:]}")

    def tree(self) -> list[psutil.Process]:
        """The standalone process, its descendants, and the embedded PostgreSQL, which
        pgserver starts detached (as its own user, reparented to init)."""
        main = psutil.Process(self.process.pid)
        processes = [main, *main.children(recursive=True)]
        pgdata = str(self.data / "pgdata")
        for candidate in psutil.process_iter(["cmdline"]):
            with_pgdata = pgdata in " ".join(candidate.info["cmdline"] or ())
            if with_pgdata and candidate not in processes:
                processes.append(candidate)
                with contextlib.suppress(psutil.Error):  # it may end while we look
                    processes.extend(candidate.children(recursive=True))
        return processes

    def stop(self, *, ctrl_c: bool = False) -> None:
        """SIGTERM to the standalone process only (`ctrl_c`: SIGINT to its whole process group,
        as a terminal's Ctrl-C sends it); record how long until every process of its tree was
        gone, and what was left."""
        processes = self.tree()
        started = time.monotonic()
        if ctrl_c:
            os.killpg(self.process.pid, signal.SIGINT)  # start() made it a group leader
        else:
            self.process.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=STOP_SECONDS)
        left = max(STOP_SECONDS - (time.monotonic() - started), 0.1)
        _, alive = psutil.wait_procs(processes, timeout=left)
        self.stopped_in = time.monotonic() - started
        self.leftovers = [_describe(p) for p in alive if _running(p)]
        for process in alive:  # processes this test started: never leave them behind
            with contextlib.suppress(psutil.Error):
                process.kill()


def _describe(process: psutil.Process) -> str:
    try:
        return f"{process.pid} {' '.join(process.cmdline()[:3])}"
    except psutil.Error:
        return str(process.pid)


def _running(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def start(data: Path, log_path: Path, **servers: str) -> Standalone:
    port = free_port()
    handle = log_path.open("ab")
    process = subprocess.Popen(
        [sys.executable, "manage.py", "standalone", "--port", str(port), "--concurrency", "1"],
        cwd=settings.BASE_DIR, env=standalone_env(data, **servers), stdout=handle,
        stderr=subprocess.STDOUT, start_new_session=True,
    )
    handle.close()
    return Standalone(process=process, data=data, port=port, log_path=log_path)


def kinds(processes: list[psutil.Process]) -> set[str]:
    found = set()
    for process in processes:
        try:
            command = " ".join(process.cmdline())
        except psutil.Error:  # a short-lived child (a probe, a git call) ended since the listing
            continue
        for kind in ("uvicorn", "celery", "redis-server", "postgres"):
            if kind in command:
                found.add(kind)
    return found


def served_by(processes: list[psutil.Process]) -> list[dict[str, str]]:
    """The environment of each web process uvicorn's supervisor started (multiprocessing's
    spawned children)."""
    web = []
    for process in processes:
        with contextlib.suppress(psutil.Error):
            if "uvicorn" in " ".join(process.cmdline()):
                web += [child.environ() for child in process.children()
                        if "spawn_main" in " ".join(child.cmdline())]
    return web


def sign_in(base: str, username: str, password: str) -> urllib.request.OpenerDirector:
    opener = urllib.request.build_opener(
        urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
    with opener.open(f"{base}/accounts/login/", timeout=10) as response:
        page = response.read().decode()
    found = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    assert found, page
    form = urlencode({"username": username, "password": password,
                      "csrfmiddlewaretoken": found.group(1)}).encode()
    with opener.open(f"{base}/accounts/login/", data=form, timeout=10) as response:
        assert "/accounts/login/" not in response.geturl(), "the sign-in was refused"
    return opener


def get(opener: urllib.request.OpenerDirector, url: str) -> tuple[int, str]:
    try:
        with opener.open(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


# --------------------------------------------------------------------------- embedded servers


@dataclass
class Lifecycle:
    """What two starts of standalone on one data folder showed."""

    first: Standalone
    second: Standalone
    tree_kinds: set[str]
    web_processes: list[dict[str, str]]  # each web process's environment
    healthz: int
    target_page: tuple[int, str]
    second_target_page: tuple[int, str]
    password: str


# The tests that read one lifecycle share one xdist process (--dist loadgroup): spread over
# two, each process would start the whole system twice for the same facts.
LIFECYCLE = pytest.mark.xdist_group("standalone-lifecycle")


@pytest.fixture(scope="module")
def lifecycle() -> Iterator[Lifecycle]:
    data = fresh_data_folder()
    logs = Path(tempfile.mkdtemp(prefix="infraops-standalone-logs-"))
    first = start(data, logs / "first.log")
    second = None
    try:
        first.wait_until_ready()
        tree_kinds = kinds(first.tree())
        web_processes = served_by(first.tree())
        with urllib.request.urlopen(f"{first.base}/healthz", timeout=5) as response:
            healthz = response.status
        found = ADMIN_RE.search(first.log)
        assert found, first.log
        password = found.group(1)
        target_page = get(sign_in(first.base, "admin", password),
                          f"{first.base}/targets/tiny-serving/")
        first.stop()

        second = start(data, logs / "second.log")
        second.wait_until_ready()
        second_target_page = get(sign_in(second.base, "admin", password),
                                 f"{second.base}/targets/tiny-serving/")
        second.stop(ctrl_c=True)
        yield Lifecycle(first=first, second=second, tree_kinds=tree_kinds,
                        web_processes=web_processes, healthz=healthz,
                        target_page=target_page, second_target_page=second_target_page,
                        password=password)
    finally:
        for run in (first, second):
            if run is not None and run.process.poll() is None:
                run.stop()
        shutil.rmtree(data, ignore_errors=True)
        shutil.rmtree(logs, ignore_errors=True)


@pytest.mark.e2e
@LIFECYCLE
def test_a_first_start_prints_the_url_and_the_admin_password_once(lifecycle: Lifecycle) -> None:
    log = lifecycle.first.log

    assert f"InfraOps is running at http://127.0.0.1:{lifecycle.first.port}/" in log
    assert log.count("Created admin") == 1
    assert log.count(lifecycle.password) == 1
    assert "Traceback" not in log


@pytest.mark.e2e
@LIFECYCLE
def test_it_runs_web_worker_redis_and_postgres_on_the_data_folder(lifecycle: Lifecycle) -> None:
    assert lifecycle.tree_kinds == {"uvicorn", "celery", "redis-server", "postgres"}
    # A web process per core, up to four (settings.WEB_PROCESSES): the pages are Python. With
    # several, two threads each: more fought over each process's interpreter lock.
    assert len(lifecycle.web_processes) == settings.WEB_PROCESSES == min(os.cpu_count() or 1, 4)
    threads = {env.get("INFRAOPS_WEB_THREADS", "unset") for env in lifecycle.web_processes}
    assert threads == ({"2"} if settings.WEB_PROCESSES > 1 else {"unset"}), threads
    assert (lifecycle.first.data / "pgdata" / "PG_VERSION").is_file()
    assert (lifecycle.first.data / "secret_key").is_file()


@pytest.mark.e2e
@LIFECYCLE
def test_healthz_answers(lifecycle: Lifecycle) -> None:
    assert lifecycle.healthz == 200


@pytest.mark.e2e
@LIFECYCLE
def test_the_admin_signs_in_with_the_printed_password_and_sees_the_example_target(
    lifecycle: Lifecycle,
) -> None:
    status, page = lifecycle.target_page

    assert status == 200
    assert "<h1>tiny-serving</h1>" in page
    assert "latency-bench" in page  # the manifest was read
    assert "Lower per-request latency" in page  # and the goal was made


@pytest.mark.e2e
@LIFECYCLE
def test_sigterm_stops_it_and_every_child(lifecycle: Lifecycle) -> None:
    first = lifecycle.first

    assert first.leftovers == []
    assert first.stopped_in is not None and first.stopped_in < 20
    assert first.process.returncode == 0
    assert "Stopped." in first.log


@pytest.mark.e2e
@LIFECYCLE
def test_a_second_start_on_the_same_data_creates_no_admin_and_keeps_the_target(
    lifecycle: Lifecycle,
) -> None:
    second = lifecycle.second
    status, page = lifecycle.second_target_page

    assert "Created admin" not in second.log and "First start" not in second.log
    assert "InfraOps is running at" in second.log
    assert status == 200  # the first start's password still works: the same database
    assert "<h1>tiny-serving</h1>" in page
    assert page.count("Lower per-request latency") == 1  # load_example made no second goal
    # Stopped by a Ctrl-C to its whole process group: the embedded Redis, in a session of its
    # own, is stopped after the workers that use it, so none meets it gone.
    assert second.leftovers == [] and second.process.returncode == 0
    assert "Stopped." in second.log
    assert "Traceback" not in second.log and "out of reach" not in second.log


# --------------------------------------------------------------------------- refusals


def test_a_port_in_use_is_refused_in_one_sentence() -> None:
    data = fresh_data_folder()
    try:
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            result = subprocess.run(
                [sys.executable, "manage.py", "standalone", "--port", str(port)],
                cwd=settings.BASE_DIR, env=standalone_env(data), capture_output=True,
                text=True, timeout=60,
            )
        output = result.stdout + result.stderr

        assert result.returncode != 0
        assert f"Port {port} on 127.0.0.1 is in use" in output
        assert "Traceback" not in output
        assert not (data / "pgdata").exists()  # nothing was started
        assert not (data / "redis.sock").exists()
    finally:
        shutil.rmtree(data, ignore_errors=True)


def test_a_port_a_stopped_server_just_closed_is_free_again() -> None:
    """Ctrl-C and start again: the stopped server's side of its connections waits in
    TIME_WAIT for a minute, which a bind without SO_REUSEADDR took for a port in use."""
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = server.accept()
        accepted.close()  # the server closes first: its side goes to TIME_WAIT
        client.close()
    with socket.socket() as plain, pytest.raises(OSError):
        plain.bind(("127.0.0.1", port))  # what the old check did
    assert port_free("127.0.0.1", port)


@pytest.mark.parametrize("remote", [False, True])
def test_agent_steps_and_experiments_have_a_worker_and_pool_each(remote: bool) -> None:
    """A step held by a hung model endpoint must never hold a process an experiment needs."""
    commands = worker_commands(concurrency=2, schedule=Path("/data/beat"), host="h",
                               remote=remote)

    queues = {env: argv[argv.index("-Q") + 1] for env, argv in commands}
    assert queues == {"agent": "agent", "experiments": "experiments"}
    beats = [env for env, argv in commands if "-B" in argv]
    assert beats == ["agent"]  # one beat, beside the agent steps
    assert all(argv[argv.index("-c") + 1] == "2" for _, argv in commands)


def test_a_port_out_of_range_is_refused_in_one_sentence() -> None:
    data = fresh_data_folder()
    try:
        result = subprocess.run(
            [sys.executable, "manage.py", "standalone", "--port", "70000"],
            cwd=settings.BASE_DIR, env=standalone_env(data), capture_output=True, text=True,
            timeout=60,
        )
    finally:
        shutil.rmtree(data, ignore_errors=True)

    assert result.returncode != 0
    assert "Traceback" not in result.stdout + result.stderr
    assert "70000" in result.stderr


# --------------------------------------------------------------------------- external servers


@pytest.fixture
def external_database() -> Iterator[str]:
    """A fresh database on the machine's PostgreSQL, dropped afterwards."""
    db = connection.settings_dict
    host, port = db["HOST"] or "127.0.0.1", db["PORT"] or 5432
    name = f"infraops_standalone_{uuid.uuid4().hex[:10]}"
    admin = f"postgresql://{db['USER']}@{host}:{port}/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgres://{db['USER']}@{host}:{port}/{name}"
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.mark.e2e
def test_with_database_and_redis_urls_set_it_uses_those_servers(
    external_database: str, tmp_path: Path
) -> None:
    data = fresh_data_folder()
    redis_url = spare_redis_url(2)  # this process's own: the system it starts consumes it
    run = start(data, tmp_path / "external.log", DATABASE_URL=external_database,
                REDIS_URL=redis_url)
    try:
        run.wait_until_ready()
        tree_kinds = kinds(run.tree())
        with psycopg.connect(external_database.replace("postgres://", "postgresql://")) as conn:
            admins = conn.execute(
                "SELECT count(*) FROM auth_user WHERE username = 'admin' AND is_superuser"
            ).fetchone()
            targets = conn.execute(
                "SELECT count(*) FROM infraops_target WHERE name = 'tiny-serving'").fetchone()
        embedded = [name for name in ("pgdata", "redis.sock") if (data / name).exists()]
        deadline = time.monotonic() + 30
        beats: list[bytes] = []
        while not beats and time.monotonic() < deadline:
            beats = list(redis.Redis.from_url(redis_url).scan_iter(
                match=f"infraops:worker:*standalone@{socket.gethostname()}"))
            time.sleep(0.3)
    finally:
        run.stop()
        shutil.rmtree(data, ignore_errors=True)

    assert admins == (1,)
    assert targets == (1,)
    assert beats, "the worker does not beat in the Redis of REDIS_URL"
    assert tree_kinds == {"uvicorn", "celery"}
    assert embedded == []
    assert "Starting the embedded" not in run.log
    assert "Created admin" in run.log
    assert run.leftovers == []
