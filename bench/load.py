"""HTTP load on the web: 30 signed-in clients on the five pages a reviewer reads while runs
stream.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres REDIS_URL=redis://127.0.0.1:6379/10 \
        .venv/bin/python bench/load.py [--requests 1200] [--clients 30] [--stream-rate 10] \
        [--database infraops_load]

It creates (and drops) its own database (--database, `infraops_load` unless told) on
DATABASE_URL's server, with the example target, a signed-in engineer, two running runs with
steps and events, a finished experiment (its executions, 300 output rows, feedback with
findings, A/B distributions of three metrics and a four-thread timeline) and a change of the
serving configuration waiting for review (a real commit in the clone, with that experiment and
a line comment); starts uvicorn with as many web processes as `manage.py standalone` does
(--web-processes; settings.WEB_PROCESSES) on it; and sends
--requests requests from --clients concurrent clients (each its own keep-alive connection, one
shared session), each request the next of the five pages in turn: the dashboard, a run page,
the experiment page, the review queue and the change page, while --stream-rate log lines a
second are appended to each run through the product's own append. After the load one client
reads each page alone for its web CPU per request. A smoke run (seconds; it runs, the figures
mean little): --requests 40 --clients 4.

History on this machine class (2 cores): 30 clients on one web process gave a p95 of 1.5 s and
29% 500s ('too many clients': every request thread kept its own connection); a connection
pool, one thread per request and fewer queries brought it to 0.41-0.58 s; access per target
to 0.62-0.66 s (13.5-15.5 ms of web CPU a request). On 2026-12-02's machine: 0.82-1.36 s,
20-24 ms a request; each request's user in one query and every HTTP request served whole by
one thread of a fixed pool (infraops/project/asgi.py): 0.71-0.77 s, 17-18 ms. Then the reads every
page makes as statements built once per process (session, user, roles, the review count, the
page's main object with its relations: infraops/reads.py) and server-side prepared statements
(PostgreSQL's planning of the joined reads had competed for the second core): 0.24-0.29 s at
150-180 requests/s, 5.2-6.2 ms of web CPU a request.

Issue 28 put the five pages under the load: the experiment and change pages cost 123-127 ms of
web CPU a request (plotly figures built on every read, the record and output rendered again,
git run four times for an open change's gate) against 10-14 for the others. Their finished
parts rendered once per process (infraops/fragments.py), the change read in one prepared
statement, git asked once per pair of commits and the gate written only when it moves: see
docs/reliability.md, row P1, for the figures. On 2026-12-07 one process held one core while
PostgreSQL used 13% of the other: two web processes (standalone's default since, one per
core) gave 90-93 requests/s against 52-57 and a median of 300-310 ms against 513-571, a p95
of 604-624 ms against 700-776. With two threads a process instead of eight (standalone's
default with several processes since): p95 292-492 ms over six runs, 9.3-15.3 ms of web CPU a
request, on a machine whose speed varied by a third between runs. That evening the reads the
ORM built on every request became statements built once per process (the dashboard's goals,
the queue's changes and choices, the change page's decisions, comments and runs, the run
page's newest event, the experiment page's links) and the change page's diff tables were
rendered once per state: p95 140-358 ms over five runs (4 under 300), 5.2-7.3 ms of web CPU a
request, against 309-399 ms and 9.8-12.3 ms for the morning's code run in turn.

Figures: http_p95_ms_30_clients (target <= 300 on a quiet machine) and
http_error_rate_30_clients (target 0: any status but 200, or no answer); to tell where time
goes: http_median_ms_30_clients, http_p95_ms_<page> (each page's own: dashboard, run_page,
experiment_page, queue_page, change_page), http_throughput_rps, web_cpu_ms_per_request (the
web processes' CPU time over the load, per request: what the pages cost it, whatever else
the machine runs), web_cpu_ms_per_request_<page> (one client reading that page alone after
the load), streamed_lines_per_s, db_connections_peak (the web's connections, sampled every
50 ms), db_connections_after (2 s after the load), web_processes, web_threads_per_process and
web_cpu_share_busiest_process (the busiest web process's part of the web's CPU:
1/web_processes when they share evenly), and the load average around the run (the machine
has 2 cores and may be running a CI suite as well).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit, urlunsplit

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench import database_create, database_drop, database_url  # noqa: E402

USER, PASSWORD = "loader", "correct horse battery staple"


def figure(name: str, value: float, unit: str) -> None:
    print(f"figure: {name} {value:.4g} {unit}", flush=True)


def _admin_url() -> str:
    base = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    return urlunsplit(urlsplit(base)._replace(path="/postgres"))


def _database(name: str, create: bool) -> str:
    """Drop the database `name` (and create it again when `create`); its URL."""
    if create:
        return database_create(name)
    database_drop(name)
    return database_url(name)


def connections_of(database: str) -> int:
    """Client connections to `database`, this sampler's own excepted."""
    import psycopg

    with psycopg.connect(_admin_url(), autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s "
                           "AND pid <> pg_backend_pid()", [database]).fetchone()
    return int(row[0]) if row else 0


def setup(data: Path, database: str) -> tuple[dict[str, str], dict[str, str], list[int]]:
    """The database with the example target, a signed-in engineer and what a reviewer reads:
    two runs that stream, a finished experiment with its feedback, a change waiting for
    review. The web process's env, each page's address by name, the streaming runs."""
    env = os.environ | {
        "DATABASE_URL": _database(database, create=True), "INFRAOPS_DATA": str(data),
        "DJANGO_SETTINGS_MODULE": "infraops.project.settings", "PYTHONUNBUFFERED": "1",
        "SECRET_KEY": os.environ.get("SECRET_KEY") or "load-bench-" + os.urandom(16).hex(),
    }
    env.setdefault("REDIS_URL", "redis://127.0.0.1:6379/10")
    os.environ.update(env)
    import django

    django.setup()
    from django.contrib.auth.models import Group, User
    from django.core.management import call_command

    from infraops.models import Goal

    call_command("migrate", verbosity=0)
    user = User.objects.create_user(USER, password=PASSWORD, is_staff=True)
    user.groups.add(Group.objects.get_or_create(name="engineer")[0])
    # After the user: load_example makes the role holders members of the example target, so
    # the pages pay for the per-target access check as every member's do.
    call_command("load_example", stdout=open(os.devnull, "w"))  # noqa: SIM115
    goal = Goal.objects.get()
    runs = [streaming_run(goal, user) for _ in range(2)]
    experiment = finished_experiment(goal, runs[0])
    change = waiting_change(goal, user, experiment, data)
    from django.db import connections

    connections.close_all()
    pages = {"dashboard": "/", "run_page": f"/runs/{runs[0]}/",
             "experiment_page": f"/experiments/{experiment}/", "queue_page": "/reviews/",
             "change_page": f"/reviews/changes/{change}/"}
    return env, pages, runs


def streaming_run(goal: Any, user: Any) -> int:
    """A running run with 20 steps and 40 events, as a run an hour in has."""
    from agents.models import AgentRun, RunEvent, Step

    run = AgentRun.objects.create(
        goal_version=goal.versions.get(), target=goal.target, policy="tuner",
        status=AgentRun.Status.RUNNING, started_by=user, base_commit=goal.target.manifest_commit,
        manifest_sha256=goal.target.manifest_sha256, step_count=20, event_seq=40)
    Step.objects.bulk_create(
        Step(run=run, number=n, summary=f"step {n}: try batch_size={2 ** (n % 6)}",
             tool="experiment_request", arguments={"batch_size": str(2 ** (n % 6))},
             verdict=f"objective {1 - n / 100:.3f}") for n in range(1, 21))
    RunEvent.objects.bulk_create(
        RunEvent(run=run, seq=n, kind="step", message=f"Step {n} done.") for n in range(1, 41))
    return int(run.pk)


REPEATS = 5  # samples a side per probe, after each side's warm-up
METRICS = (("latency_ms", "ms"), ("throughput_rps", "req/s"), ("instructions", ""))


def finished_experiment(goal: Any, run: int) -> int:
    """A succeeded experiment as the example's probe leaves one: its executions (a warm-up and
    five repeats a side) with their output, 300 log lines, and feedback with findings, the
    A/B distributions of three metrics, a criterion's verdict and a four-thread timeline."""
    import random
    from datetime import timedelta

    from django.utils import timezone

    from infraops.models import Experiment, ExperimentLog, ProbeExecution

    rng = random.Random(28)
    target = goal.target
    values = {(metric, side): [scale * (1 + rng.gauss(0, 0.02)) for _ in range(REPEATS)]
              for metric, scale0 in (("latency_ms", 12.0), ("throughput_rps", 80.0),
                                     ("instructions", 4.1e8))
              for side, scale in (("baseline", scale0), ("candidate", scale0 * 0.9))}
    findings: list[dict[str, Any]] = [
        {"severity": ("pass", "info", "warn")[n % 3], "layer": "performance", "kind": "metric",
         "title": f"latency-bench {metric} case {n}: -10.0%",
         "detail": "median 12.0 -> 10.8 ms (95% CI -12.1% to -7.9%)\n5 samples a side",
         "evidence": {"executions": [2 + n, 8 + n], "probe": "latency-bench"}}
        for n, (metric, _) in enumerate(METRICS * 4)]
    criterion = goal.versions.get().spec.get("criteria", [{}])[0]
    findings.append({"severity": "pass", "layer": "criteria", "kind": "criterion",
                     "title": criterion.get("description", "latency"), "detail": "-10.0%",
                     "evidence": {"criterion": criterion.get("id"), "verdict": {
                         "passed": True, "detail": "-10.0% (95% CI -12.1% to -7.9%)"}}})
    threads = ["main", "worker-1", "worker-2", "worker-3"]
    spans = [[t, f"batch {n}", n * 1.0 + t * 0.2, n * 1.0 + t * 0.2 + 0.7]
             for n in range(50) for t in range(len(threads))]
    feedback = {
        "verdict": "improved", "counts": {"pass": 5, "fail": 0, "warn": 4, "info": 4},
        "findings": findings,
        "distributions": [{"label": f"latency-bench {metric}", "metric": metric, "unit": unit,
                           "baseline": values[metric, "baseline"],
                           "candidate": values[metric, "candidate"]} for metric, unit in METRICS],
        "timelines": {"latency-bench [default, candidate]": {
            "threads": threads, "spans": spans, "waits": spans[::7], "idle": [],
            "overlap": [[n * 1.0 + 0.6, n * 1.0 + 0.9] for n in range(50)], "duration": 50.7}},
        "next_steps": ["Try batch_size=16 next.", "Confirm on the concurrency probe."],
        "agent_text": "\n".join(f"{f['severity']}: {f['title']}" for f in findings),
    }
    experiment = Experiment.objects.create(
        target=target, candidate_commit="b" * 40, baseline_commit=target.manifest_commit,
        status=Experiment.Status.SUCCEEDED, probes=["latency-bench"], attempts=1,
        started_at=timezone.now() - timedelta(minutes=2), finished_at=timezone.now(),
        manifest_sha256=target.manifest_sha256, origin=f"run {run}, step 3",
        criteria=goal.versions.get().spec.get("criteria", []), feedback=feedback,
        summary={"comparisons": [
            {"probe": "latency-bench", "variant": "", "metric": metric, "case": "", "unit": unit,
             "baseline_median": values[metric, "baseline"][2],
             "candidate_median": values[metric, "candidate"][2], "ratio": 0.9,
             "baseline_n": REPEATS, "candidate_n": REPEATS} for metric, unit in METRICS]})
    output = "".join(f"latency_ms {10 + n / 100:.3f}\n" for n in range(60))
    ProbeExecution.objects.bulk_create(
        ProbeExecution(experiment=experiment, attempt=1, probe="latency-bench", side=side,
                       repeat_index=index, seed=1000 + index, exit_code=0, reason="ok",
                       wall_seconds=1.5, stdout=output, stderr="")
        for side in ("baseline", "candidate") for index in range(-1, REPEATS))
    ExperimentLog.objects.bulk_create(
        ExperimentLog(experiment=experiment, seq=n, execution_label="latency-bench baseline #1",
                      stream="stdout", text=f"latency_ms {10 + n / 1000:.3f}")
        for n in range(1, 301))
    Experiment.objects.filter(pk=experiment.pk).update(log_seq=300)
    return int(experiment.pk)


def waiting_change(goal: Any, user: Any, experiment: int, data: Path) -> int:
    """A change of the serving configuration (production risk, so it waits for review) with
    its experiment and a line comment: its page evaluates the gate again on every read, as an
    open change's page does."""
    from infraops import gitops
    from infraops.models import Experiment
    from reviews.models import ReviewComment
    from reviews.services import change_submit

    target = goal.target
    base = gitops.rev_parse(target.clone_path, f"refs/heads/{target.base_branch}")
    tree = data / "candidate"
    gitops.worktree_add(target.clone_path, tree, base)
    (tree / "config/serving.toml").write_text(
        "# Serving configuration of the tiny engine.\n# Measured: 16 amortises the dispatch "
        "overhead best.\nbatch_size = 16\nmax_queue = 512\n")
    head = gitops.commit_all(tree, "Batch by size", author_name="InfraOps agent",
                             author_email="agent@example.test")
    gitops.worktree_remove(target.clone_path, tree)
    assert head is not None
    change = change_submit(
        target=target, goal_version=goal.versions.get(),
        experiment=Experiment.objects.get(pk=experiment), title="Batch requests by size",
        hypothesis="Bigger batches amortise the dispatch overhead.", evidence={},
        base_commit=base, head_commit=head, author_label="run 1", requested_by=user)
    ReviewComment.objects.create(change=change, author=user, path="config/serving.toml",
                                 line=2, text="Why 16 and not 8?", diff_sha256=change.diff_sha256)
    return int(change.pk)


def start_web(env: dict[str, str], data: Path, port: int,
              processes: int) -> subprocess.Popen[bytes]:
    log = (data / "web.log").open("wb")
    web = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "infraops.project.asgi:application",
         "--host", "127.0.0.1", "--port", str(port), "--no-access-log",
         "--workers", str(processes)],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if web.poll() is not None:
            raise SystemExit(f"the web process exited: {(data / 'web.log').read_text()[-2000:]}")
        try:
            status, _, _ = request(port, "GET", "/healthz")
            if status == 200:
                return web
        except OSError:
            pass
        time.sleep(0.2)
    web.kill()  # not returned, so the caller cannot stop it
    web.wait()
    raise SystemExit("the web process did not answer /healthz within 60 s: "
                     f"{(data / 'web.log').read_text()[-2000:]}")


def stop_web(web: subprocess.Popen[bytes]) -> None:
    """Stop uvicorn's supervisor and every web process it started: one it did not stop in
    time (or that outlived a killed supervisor) is killed, never left serving."""
    processes: list[psutil.Process] = []
    with contextlib.suppress(psutil.NoSuchProcess):
        processes = psutil.Process(web.pid).children(recursive=True)
    web.terminate()
    try:
        web.wait(timeout=20)
    except subprocess.TimeoutExpired:
        web.kill()
        web.wait()
    _, alive = psutil.wait_procs(processes, timeout=10)
    for process in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()


def request(port: int, method: str, path: str, *, cookie: str = "", body: str = "",
            conn: http.client.HTTPConnection | None = None,
            ) -> tuple[int, dict[str, str], bytes]:
    own = conn is None
    conn = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Cookie": cookie} if cookie else {}
    if body:
        headers["Content-Type"] = "application/x-www-form-urlencoded"
        headers["Referer"] = f"http://127.0.0.1:{port}/accounts/login/"
    try:
        conn.request(method, path, body=body or None, headers=headers)
        response = conn.getresponse()
        content = response.read()
        cookies = [v for k, v in response.getheaders() if k.lower() == "set-cookie"]
        return response.status, {"set-cookie": "\n".join(cookies)}, content
    finally:
        if own:
            conn.close()


def _cookies(set_cookie: str) -> dict[str, str]:
    return dict(re.findall(r"(?m)^\s*([^=;\s]+)=([^;]*)", set_cookie))


def sign_in(port: int) -> str:
    """The Cookie header of a signed-in session."""
    _, headers, page = request(port, "GET", "/accounts/login/")
    jar = _cookies(headers["set-cookie"])
    token = re.search(rb'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    assert token is not None, "no CSRF token on the login page"
    body = urlencode({"username": USER, "password": PASSWORD,
                      "csrfmiddlewaretoken": token.group(1).decode()})
    status, headers, _ = request(port, "POST", "/accounts/login/", body=body,
                                 cookie=f"csrftoken={jar['csrftoken']}")
    jar |= _cookies(headers["set-cookie"])
    if status != 302 or "sessionid" not in jar:
        raise SystemExit(f"signing in failed (HTTP {status})")
    return "; ".join(f"{k}={v}" for k, v in jar.items())


def load(port: int, cookie: str, paths: list[str], requests: int, clients: int,
         ) -> tuple[dict[str, list[float]], int, float]:
    """Latencies (s) of `requests` requests from `clients` threads by path, the errors, the
    wall time."""
    latencies: dict[str, list[float]] = {path: [] for path in paths}
    errors = 0
    counter = iter(range(requests))
    lock = threading.Lock()

    def client() -> None:
        nonlocal errors
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        while True:
            with lock:
                n = next(counter, None)
            if n is None:
                break
            start = time.perf_counter()
            try:
                path = paths[n % len(paths)]
                status, _, _ = request(port, "GET", path, cookie=cookie, conn=conn)
                ok = status == 200
            except (OSError, http.client.HTTPException):
                ok = False
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            elapsed = time.perf_counter() - start
            with lock:
                latencies[path].append(elapsed)
                errors += 0 if ok else 1
        conn.close()

    threads = [threading.Thread(target=client) for _ in range(clients)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return latencies, errors, time.perf_counter() - started


def p95(ordered: list[float]) -> float:
    return ordered[max(0, round(0.95 * len(ordered)) - 1)]


def stream(runs: list[int], stop: threading.Event, rate: float) -> int:
    """Append `rate` log lines a second to each run through the product's own append (one
    transaction and one notification each) until `stop`, as a run's agent does; the lines
    appended."""
    from agents.events import run_events_append

    appended = 0
    while not stop.wait(1 / rate):
        for run in runs:
            run_events_append(run_id=run, entries=[("log", f"line {appended}", None)])
            appended += 1
    return appended


def web_cpu_by_process(pid: int) -> dict[int, float]:
    """CPU seconds of each process of the web: uvicorn's supervisor and its web processes."""
    web = psutil.Process(pid)
    spent = {}
    for process in [web, *web.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            spent[process.pid] = sum(process.cpu_times()[:2])
    return spent


def web_cpu(pid: int) -> float:
    return sum(web_cpu_by_process(pid).values())


def web_cpu_per_page(port: int, cookie: str, pid: int, pages: dict[str, str],
                     count: int) -> dict[str, float]:
    """Each page's web CPU per request (ms): `count` requests of it from one client, one
    after the other, the web processes' CPU time around them. Load-independent, where the
    latencies are not: what the page costs, whatever else the machine runs."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    costs = {}
    for name, path in pages.items():
        before = web_cpu(pid)
        for _ in range(count):
            request(port, "GET", path, cookie=cookie, conn=conn)
        costs[name] = (web_cpu(pid) - before) / count * 1000
    conn.close()
    return costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1200)
    parser.add_argument("--clients", type=int, default=30)
    parser.add_argument("--stream-rate", type=float, default=10,
                        help="log lines a second appended to each of the two running runs")
    parser.add_argument("--web-processes", type=int, default=0,
                        help="uvicorn's --workers (0: as standalone starts them, "
                             "INFRAOPS_WEB_PROCESSES or one per core up to four)")
    parser.add_argument("--database", default="infraops_load",
                        help="the database to create (and drop) on DATABASE_URL's server")
    args = parser.parse_args()
    data = Path(tempfile.mkdtemp(prefix="infraops-load-"))
    data.chmod(0o755)
    web = None
    try:
        env, pages, runs = setup(data, args.database)
        import socket

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        from django.conf import settings

        from infraops.management.commands.standalone import web_environment

        processes = args.web_processes or settings.WEB_PROCESSES
        web_env = web_environment(env, processes)
        threads = int(web_env.get("INFRAOPS_WEB_THREADS") or settings.WEB_THREADS)
        web = start_web(web_env, data, port, processes)
        cookie = sign_in(port)
        paths = list(pages.values())
        for path in paths:  # each page answers before the load
            status, _, _ = request(port, "GET", path, cookie=cookie)
            if status != 200:
                raise SystemExit(f"{path} answered {status} before the load")
        # Warm-up: templates, the pool, code paths.
        load(port, cookie, paths, min(60, args.requests), min(5, args.clients))

        peak = 0
        stop = threading.Event()

        def sample() -> None:
            nonlocal peak
            while not stop.wait(0.05):
                peak = max(peak, connections_of(args.database))

        streamed = 0

        def streamer() -> None:
            nonlocal streamed
            streamed = stream(runs, stop, args.stream_rate)

        helpers = [threading.Thread(target=sample, daemon=True),
                   threading.Thread(target=streamer, daemon=True)]
        load_before = os.getloadavg()
        cpu_before = web_cpu_by_process(web.pid)
        for helper in helpers:
            helper.start()
        by_path, errors, wall = load(port, cookie, paths, args.requests, args.clients)
        cpu_after = web_cpu_by_process(web.pid)
        by_process = [cpu_after[pid] - cpu_before.get(pid, 0.0) for pid in cpu_after]
        cpu_spent = sum(by_process)
        stop.set()
        for helper in helpers:
            helper.join()
        load_after = os.getloadavg()
        time.sleep(2)
        after = connections_of(args.database)
        per_page = web_cpu_per_page(port, cookie, web.pid, pages,
                                    max(5, args.requests // 40))

        latencies = sorted(value for values in by_path.values() for value in values)
        suffix = f"{args.clients}_clients"
        figure(f"http_p95_ms_{suffix}", p95(latencies) * 1000, "ms")
        figure(f"http_error_rate_{suffix}", errors / len(latencies), "ratio")
        figure(f"http_median_ms_{suffix}", statistics.median(latencies) * 1000, "ms")
        for name, path in pages.items():
            figure(f"http_p95_ms_{name}", p95(sorted(by_path[path])) * 1000, "ms")
        figure("http_throughput_rps", len(latencies) / wall, "requests/s")
        figure("web_cpu_ms_per_request", cpu_spent / len(latencies) * 1000, "ms")
        for name, cost in per_page.items():
            figure(f"web_cpu_ms_per_request_{name}", cost, "ms")
        figure("db_connections_peak", peak, "connections")
        figure("db_connections_after", after, "connections")
        figure("streamed_lines_per_s", streamed / wall, "lines/s")
        figure("web_processes", processes, "processes")
        figure("web_threads_per_process", threads, "threads")
        # How evenly the processes shared the load (1: all on one; 1/processes: even): each
        # client keeps its connection, and a process keeps the connections it accepted.
        figure("web_cpu_share_busiest_process", max(by_process) / cpu_spent, "ratio")
        print(f"requests: {len(latencies)} ({args.clients} clients, pages {', '.join(paths)}); "
              f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f} "
              f"on {os.cpu_count()} cores", flush=True)
    finally:
        if web is not None:
            stop_web(web)
        from django.db import connections

        connections.close_all()
        _database(args.database, create=False)
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
