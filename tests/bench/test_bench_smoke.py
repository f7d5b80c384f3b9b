"""Every bench script still runs: each at its smoke size (seconds, or a minute where it starts a
whole system), in a process of its own, must exit 0 and print at least one well-formed figure
line. The figures are not judged here; bench/README.md says what each measures at full size.

The scripts are found by globbing bench/*.py and bench/*.sh, so a new script fails this file
until SMOKE says how to run it small (or NOT_HERE why it cannot run here, or HELPERS that it is
not a script). Those that start real web or worker processes, or run real experiments under
callgrind, are marked e2e: the fast tier (`-m "not e2e and not fuzz"`) keeps the rest.

Isolation from the suite running beside them: each script gets a database of its own with a
unique name on DATABASE_URL's server (dropped afterwards; the suite's is test_<name>), created
from one migrated template per session (BENCH_TEMPLATE_DATABASE) where the script migrates, and
a spare Redis database of the test process's own (tests.xdist_workers.spare_redis_url;
TEST_BENCH_REDIS_URL overrides it): bench/experiments.py empties its Redis database.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psutil
import pytest

from bench import TEMPLATE_ENV, database_create, database_drop, database_url
from tests.xdist_workers import spare_redis_url

ROOT = Path(__file__).resolve().parent.parent.parent
BENCH = ROOT / "bench"
PYTHON = sys.executable
FIGURE = re.compile(r"^figure: \S+ \S+ \S+", re.MULTILINE)
LEFTOVER_GRACE_SECONDS = 15
# Placeholders in Smoke.args, filled per run.
DATABASE, OUT, PORT = "{database}", "{out}", "{port}"


@dataclass(frozen=True)
class Smoke:
    """How a script runs small. database: None (none, or an embedded one of its own), "own"
    (it creates and drops the database --database names), "url" (it migrates the database
    DATABASE_URL names: the test makes one), "pytest" (it runs tests, whose pytest-django makes
    test_<DATABASE_URL's name>)."""

    args: tuple[str, ...]
    database: str | None = None
    e2e: bool = False
    timeout: int = 240  # seconds the script may take (the test a minute more)
    why_e2e: str = ""


SMOKE: dict[str, Smoke] = {
    "agent_context.py": Smoke(("--smoke", "--database", DATABASE), "own"),
    "experiments.py": Smoke(("--smoke", "--database", DATABASE), "own", e2e=True,
                            why_e2e="a real Celery worker"),
    "faults.py": Smoke(("--smoke",), "pytest", e2e=True, timeout=420,
                       why_e2e="tests/e2e/test_faults.py: redis-server, worker, web, Chromium"),
    # Its real instruction-count experiments run in tests/infraops/test_instruction_counts.py
    # (through its own code), not a second time here.
    "feedback_stats.py": Smoke(("--smoke",)),
    "fleet.py": Smoke(("--smoke", "--database", DATABASE), "own", e2e=True,
                      why_e2e="a web and remote Celery workers in mount namespaces of their own"),
    "gpu_worker.py": Smoke((OUT, "--gpu", "off", "--port", PORT, "--remote-workers"), e2e=True,
                           timeout=420, why_e2e="`manage.py standalone` (its experiment workers "
                                                "remote) and a tuner run on the CPU twin"),
    "hostile_patches.py": Smoke(("--smoke",)),
    "live_log.py": Smoke(("--smoke",), "url", e2e=True, why_e2e="a real uvicorn"),
    "load.py": Smoke(("--requests", "40", "--clients", "4", "--database", DATABASE), "own",
                     e2e=True, why_e2e="a real uvicorn"),
    "review_queue.py": Smoke(("--smoke", "--database", DATABASE), "own"),
    "risk_corpus.py": Smoke(("--smoke",)),
    "sandbox.py": Smoke(("--smoke",)),
    "start.py": Smoke(("--warm-only",), e2e=True, why_e2e="scripts/standalone.sh, twice"),
    "stream.py": Smoke(("--smoke",), "url", e2e=True, why_e2e="a real uvicorn and Chromium"),
}
# Scripts that cannot run on this machine class: why, and the command that must still work.
NOT_HERE: dict[str, tuple[str, tuple[str, ...]]] = {
    "gpu_device.sh": ("runs on the lent GPU machine only, as root, from .gpu-carry/ (installs "
                      "bubblewrap, a user, wheels; needs nvidia-smi): docs/gpu.md",
                      ("bash", "bench/gpu_device.sh", "--help")),
    "fla_record.py": ("needs a CUDA GPU with torch, Triton and fla-core; it records the "
                      "flash-linear-attention probes at every knob setting for "
                      "tests/infraops/experiments/test_fla_replay.py and docs/gpu.md",
                      (PYTHON, "bench/fla_record.py", "--help")),
    "gpu_record.py": ("needs a CUDA GPU with torch and Triton; it records executions for "
                      "tests/infraops/test_gpu_probes.py and prints no figures",
                      (PYTHON, "bench/gpu_record.py", "--help")),
}
# Modules of the package that are no scripts: each must import (after Django is set up).
HELPERS: dict[str, str] = {
    "__init__.py": "the helpers the scripts share",
    "instruction_experiments.py": "feedback_stats.py's real experiments (run at its smoke size "
                                  "by tests/infraops/test_instruction_counts.py)",
}


def bench_files() -> list[str]:
    return sorted(path.name for pattern in ("*.py", "*.sh") for path in BENCH.glob(pattern))


def marks(name: str) -> list[pytest.MarkDecorator]:
    smoke = SMOKE.get(name)
    if smoke is None:
        return []
    return [*([pytest.mark.e2e] if smoke.e2e else []), pytest.mark.timeout(smoke.timeout + 60)]


def with_path(url: str, path: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path=path))


def unique_database(stem: str) -> str:
    """A name no other run uses, under PostgreSQL's 63 bytes with room for pytest-django's
    test_ prefix."""
    base = urlsplit(os.environ.get("DATABASE_URL", "")).path.strip("/") or "infraops"
    return f"{base[:20]}_bench_{stem[:16]}_{secrets.token_hex(4)}".lower()


def bench_redis_url() -> str:
    """REDIS_URL's server, another database number (TEST_BENCH_REDIS_URL overrides it)."""
    if os.environ.get("TEST_BENCH_REDIS_URL"):
        return os.environ["TEST_BENCH_REDIS_URL"]
    return spare_redis_url(3)


def server_url() -> str:
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith(("postgres://", "postgresql://")):
        pytest.fail(f"DATABASE_URL={url!r}: the bench smoke runs need a PostgreSQL server URL "
                    "(as scripts/test.sh sets)")
    return url


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def session(sid: int) -> list[psutil.Process]:
    """The live processes of session `sid`."""
    found = []
    for process in psutil.process_iter():
        try:
            if os.getsid(process.pid) == sid and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
        except (OSError, psutil.Error):
            continue
    return found


def run(argv: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    """argv in a session of its own, killed with everything it started when it overstays; a
    process of that session still running a while after it ended fails the test (a server
    the script should have stopped), and is killed."""
    process = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        pytest.fail(f"{' '.join(argv)} ran past {timeout} s\n{tail(stdout, stderr)}")
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    deadline = time.monotonic() + LEFTOVER_GRACE_SECONDS
    while (left := session(process.pid)) and time.monotonic() < deadline:
        time.sleep(0.5)
    if left:
        described = [f"{p.pid} {' '.join(p.cmdline()[:4])}" for p in left if p.is_running()]
        for leftover in left:
            with contextlib.suppress(psutil.Error):
                leftover.kill()
        pytest.fail(f"{' '.join(argv)} left processes running: {described}\n"
                    f"{tail(stdout, stderr)}")
    return subprocess.CompletedProcess(argv, process.returncode, stdout, stderr)


def tail(stdout: str, stderr: str) -> str:
    return f"--- stdout\n{stdout[-4000:]}\n--- stderr\n{stderr[-6000:]}"


def child_env(**extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items()
           if key not in ("INFRAOPS_DATA", TEMPLATE_ENV, "BENCH_KEEP_DATABASE")}
    env.update(DJANGO_SETTINGS_MODULE="infraops.project.settings", PYTHONUNBUFFERED="1",
               DJANGO_ALLOW_ASYNC_UNSAFE="true")
    env.setdefault("SECRET_KEY", "bench-smoke-" + secrets.token_hex(16))
    return env | extra


@pytest.fixture(scope="session")
def bench_template() -> Iterator[str]:
    """One migrated database that each script's own is created from (its migrate is then
    quick); dropped at the end of the session."""
    url = server_url()
    name = unique_database("template")
    env = child_env(DATABASE_URL=database_create(name, url=url), REDIS_URL=bench_redis_url())
    try:
        done = run([PYTHON, "manage.py", "migrate", "--verbosity", "0"], env, timeout=300)
        assert done.returncode == 0, f"migrating the bench template failed\n" \
                                     f"{tail(done.stdout, done.stderr)}"
        yield name
    finally:
        database_drop(name, url=url)


@pytest.fixture
def smoke_database(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    """(a unique database name, the bench template) for a script that needs a database; the
    name is dropped afterwards whatever the script did (and test_<name> after a test run)."""
    name = unique_database(Path(request.node.callspec.params["name"]).stem)
    template = request.getfixturevalue("bench_template")
    url = server_url()
    try:
        yield name, template
    finally:
        database_drop(name, url=url)
        database_drop(f"test_{name}", url=url)


@pytest.mark.parametrize("name", [pytest.param(name, marks=marks(name))
                                  for name in bench_files()])
def test_bench_script_runs_at_smoke_size(name: str, request: pytest.FixtureRequest,
                                         tmp_path: Path) -> None:
    if name in NOT_HERE:
        why, argv = NOT_HERE[name]
        done = run(list(argv), child_env(), timeout=60)
        assert done.returncode == 0 and "usage" in done.stdout.lower(), \
            f"{name} cannot run here ({why}), but its usage must print\n" \
            f"{tail(done.stdout, done.stderr)}"
        return
    if name in HELPERS:
        module = f"bench.{Path(name).stem}" if name != "__init__.py" else "bench"
        done = run([PYTHON, "-c", f"import django; django.setup(); import {module}"],
                   child_env(), timeout=60)
        assert done.returncode == 0, f"{module} does not import\n" \
                                     f"{tail(done.stdout, done.stderr)}"
        return
    smoke = SMOKE.get(name)
    if smoke is None:
        pytest.fail(f"bench/{name} has no smoke run: add it to SMOKE in {Path(__file__).name} "
                    "(and its full and smoke commands to bench/README.md), or to NOT_HERE with "
                    "the reason it cannot run here")
    env = child_env(REDIS_URL=bench_redis_url())
    database = ""
    if smoke.database is not None:
        database, template = request.getfixturevalue("smoke_database")
        if smoke.database == "url":  # the script migrates DATABASE_URL's own database
            env["DATABASE_URL"] = database_create(database, url=server_url(), template=template)
        elif smoke.database == "pytest":  # its tests make test_<database>
            env["DATABASE_URL"] = database_url(database, server_url())
        else:  # it makes --database on DATABASE_URL's server, from the template
            env["DATABASE_URL"] = database_url("postgres", server_url())
            env[TEMPLATE_ENV] = template
    else:  # nothing of the suite's: scripts without a database of ours use their own
        env.pop("DATABASE_URL", None)
    interpreter = ["bash"] if name.endswith(".sh") else [PYTHON]
    args = [arg.replace(DATABASE, database).replace(OUT, str(tmp_path / "out"))
            .replace(PORT, str(free_port())) for arg in smoke.args]
    done = run([*interpreter, f"bench/{name}", *args], env, timeout=smoke.timeout)
    assert done.returncode == 0, f"bench/{name} {' '.join(args)} exited {done.returncode}\n" \
                                 f"{tail(done.stdout, done.stderr)}"
    assert FIGURE.search(done.stdout), f"bench/{name} printed no figure line\n" \
                                       f"{tail(done.stdout, done.stderr)}"


def test_the_tables_name_only_bench_files_that_exist() -> None:
    files = set(bench_files())
    named = [*SMOKE, *NOT_HERE, *HELPERS]
    assert len(named) == len(set(named)), "a file is in more than one table"
    assert set(named) <= files, f"no such bench files: {sorted(set(named) - files)}"


def test_the_readme_says_how_to_run_each_script_full_size_and_small() -> None:
    readme = (BENCH / "README.md").read_text()
    for name, smoke in SMOKE.items():
        assert f"bench/{name}" in readme, f"bench/README.md does not name bench/{name}"
        flag = next((arg for arg in smoke.args if arg.startswith("--")), None)
        if flag is not None:
            assert re.search(rf"bench/{re.escape(name)}[^\n]*{re.escape(flag)}", readme), \
                f"bench/README.md does not say how to run bench/{name} small ({flag})"
    for name in NOT_HERE:
        assert f"bench/{name}" in readme, f"bench/README.md does not name bench/{name}"
