"""The product end to end on a machine with a GPU: `standalone --gpu on` (embedded PostgreSQL and
Redis, the web, the worker and the GPU worker), the tuner run on the demo's GPU goal, read back
through the database and the web pages, as a user would see it.

    python3 bench/gpu_worker.py OUT_DIR [--port 8321] [--deadline 900] [--gpu off] [--goal NAME]
                                        [--remote-workers]
    python3 bench/gpu_worker.py OUT_DIR --fla [--deadline 900] [--max-experiments N]
                                        [--fla-target fla-kda|fla-cp ...] [--fla-goal TEXT ...]
                                        [--steer TARGET:MESSAGE ...]

`--fla`: the flash-linear-attention targets instead (examples/fla-kda, examples/fla-cp, built
from the installed fla-core): the standalone with its scripted model (`--demo-llm`), then every
goal of both, the KDA tuner, the CP tuner and the CP LLM agent, one run after the other: the
GPU worker takes one experiment at a time, so runs started together would all end last and a
deadline would cut every one of them short. `--max-experiments N` lowers each goal's boundary
to at most N experiments first, as an engineer would in the goal editor to fit a GPU lease
(the summary names the cap). `--fla-goal TEXT` keeps only the goals whose name holds TEXT.
`--steer TARGET:MESSAGE` sends MESSAGE, as the admin, to each run on TARGET as soon as it starts,
as an engineer steers a run from its page (the tuner reads `knob=value` as "try that next" and
`stop` as "submit the best once it is read"); the summary names every message sent.

Run it with the Python that holds torch and Triton and the product's packages, as root (the
sandbox user), with INFRAOPS_SANDBOX_TOOLCHAINS naming that Python's environment when it is not
under /usr: bench/gpu_device.sh does all of it on the lent H200. Writes OUT_DIR/summary.json
(the GPUs by name, the run, each experiment with its queue, worker, timings and errors per
length, the change and its risk), the pages as HTML and the standalone's log; prints the
figures.

`--gpu off` is the smoke test of this script on a machine without a GPU: no GPU worker, and the
demo's CPU twin of the GPU goal (CPU_GOAL: the same merge, kda/**) unless --goal names another.
`--remote-workers`: the experiment (and GPU) workers run as workers of another host would, with
a data folder of their own, reaching the web over HTTP (docs/deploy.md); the summary names the
repositories their cache fetched.
The embedded PostgreSQL is stopped and the data folder removed at the end.
"""

from __future__ import annotations

import argparse
import http.cookiejar
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from infraops.embedded import postgres_url  # noqa: E402  (no Django: before the settings)

GOAL = "Numerics on the GPU: the Triton merge stays close to float64"
# Without a GPU worker the GPU goal is never started (start_runs: no worker serves its probe).
CPU_GOAL = "Numerics: the context-parallel merge stays close to the sequential path"
READY = "InfraOps is running at"


def devices() -> list[str]:
    """The GPUs this host has, as `nvidia-smi -L` names them (none without one): the record says
    which card its figures come from."""
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in listed.stdout.splitlines() if line.startswith("GPU ")]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--port", type=int, default=8321)
    parser.add_argument("--deadline", type=float, default=900.0)
    parser.add_argument("--goal", help="The demo goal to run (default: the GPU one; with "
                                       "--gpu off its CPU twin).")
    parser.add_argument("--gpu", default="on", choices=("on", "off"),
                        help="off: a smoke test of this script on a machine without a GPU.")
    parser.add_argument("--fla", action="store_true",
                        help="Run the goals of the flash-linear-attention targets.")
    parser.add_argument("--fla-target", action="append", choices=FLA_TARGETS, default=[],
                        help="--fla: only this target's goals (repeatable; default both).")
    parser.add_argument("--fla-goal", action="append", default=[],
                        help="--fla: only the goals whose name holds this (repeatable).")
    parser.add_argument("--steer", action="append", default=[], type=steer_option,
                        help="--fla: TARGET:MESSAGE, sent to each run on TARGET when it starts "
                             "(repeatable).")
    parser.add_argument("--max-experiments", type=int, default=None,
                        help="--fla: lower each goal's experiment budget to at most this.")
    parser.add_argument("--remote-workers", action="store_true",
                        help="The experiment workers as workers of another host: a data folder "
                             "of their own, the web over HTTP (standalone --remote-workers).")
    args = parser.parse_args()
    args.goal = args.goal or (GOAL if args.gpu == "on" else CPU_GOAL)
    args.out.mkdir(parents=True, exist_ok=True)
    data = Path(tempfile.mkdtemp(prefix="infraops-gpu-"))
    env = os.environ | {"INFRAOPS_DATA": str(data), "PYTHONUNBUFFERED": "1"}
    for name in ("DATABASE_URL", "REDIS_URL"):  # its own embedded ones
        env.pop(name, None)
    log = (args.out / "standalone.log").open("w")
    started = time.monotonic()
    servers: list[Any] = []  # this process's handle on the embedded PostgreSQL
    standalone = subprocess.Popen(
        [sys.executable, "manage.py", "standalone", "--port", str(args.port), "--gpu", args.gpu,
         "--no-showcase", *(["--demo-llm"] if args.fla else []),
         *(["--remote-workers"] if args.remote_workers else [])], cwd=ROOT, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = wait_for_page(standalone, log, started + 300)
        password = next(m[1] for line in lines
                        if (m := re.match(r"Created admin \(.*\) with password (\S+)", line)))
        for line in lines:  # its scripted model: this process starts the LLM goal's run
            if model := re.search(r"scripted model on port (\d+)", line):
                os.environ |= {"OPENAI_BASE_URL": f"http://127.0.0.1:{model[1]}/v1",
                               "INFRAOPS_MODEL": "infraops-demo", "OPENAI_API_KEY": "demo"}
        summary = drive(data, args, password, started, standalone, log, servers)
        summary["devices"] = devices()
        if args.remote_workers:
            summary["remote_worker_cache"] = sorted(
                path.name for path in (data / "worker-host" / "cache").glob("target-*.git"))
            if not summary["remote_worker_cache"]:
                raise SystemExit("--remote-workers: the remote worker fetched no repository "
                                 "into its own cache")
    finally:
        standalone.send_signal(signal.SIGTERM)
        try:
            standalone.wait(timeout=60)
        except subprocess.TimeoutExpired:
            standalone.kill()
        log.close()
        # The standalone stops its PostgreSQL only when no other process holds it: this one
        # does, so it stops it now (the last handle), then removes the data.
        for server in servers:
            server.cleanup()
        shutil.rmtree(data, ignore_errors=True)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    for name, value, unit in summary["figures"]:
        print(f"figure: {name} {value} {unit}")
    runs = summary.get("runs") or [summary]
    return 0 if all(run["run"]["status"] == "succeeded" for run in runs) else 1


def steer_option(value: str) -> tuple[str, str]:
    target, _, message = value.partition(":")
    if target not in FLA_TARGETS or not message.strip():
        raise argparse.ArgumentTypeError(
            f"--steer takes TARGET:MESSAGE with TARGET one of {', '.join(FLA_TARGETS)}, "
            f"got {value!r}")
    return target, message.strip()


def wait_for_page(standalone: subprocess.Popen[str], log: Any, deadline: float) -> list[str]:
    """The standalone's lines until it says the page answers (copied to the log)."""
    lines: list[str] = []
    assert standalone.stdout is not None
    while time.monotonic() < deadline:
        line = standalone.stdout.readline()
        if not line:
            raise SystemExit(f"standalone exited ({standalone.poll()}) before its page answered")
        log.write(line)
        log.flush()
        lines.append(line.rstrip())
        if READY in line:
            copy_rest(standalone, log)
            return lines
    raise SystemExit("standalone did not answer within 300 s")


def copy_rest(standalone: subprocess.Popen[str], log: Any) -> None:
    """Keep copying the standalone's output to the log, on a thread, so its pipe never fills."""

    def pump() -> None:
        assert standalone.stdout is not None
        for line in standalone.stdout:
            log.write(line)
            log.flush()

    threading.Thread(target=pump, daemon=True).start()


def setup_django(data: Path, gpu: bool, servers: list[Any]) -> None:
    """This process on the standalone's own database and Redis; its handle on the embedded
    PostgreSQL goes into `servers` (stopped by its cleanup() when it is the last one)."""
    import pgserver

    servers.append(pgserver.get_server(data / "pgdata", cleanup_mode="stop"))  # type: ignore[attr-defined]
    server = servers[-1]
    # The standalone's key: SECRET_KEY where this environment (so its own) has one, else the
    # one it made in the data folder.
    key = os.environ.get("SECRET_KEY") or (data / "secret_key").read_text().strip()
    os.environ |= {
        "INFRAOPS_DATA": str(data), "SECRET_KEY": key,
        "DATABASE_URL": postgres_url(server, "infraops"),
        "REDIS_URL": f"unix://{data / 'redis.sock'}",
        "DJANGO_SETTINGS_MODULE": "infraops.project.settings"}
    if gpu:
        os.environ["INFRAOPS_GPU_WORKER"] = "true"  # as standalone tells its own processes
    import django

    django.setup()


def drive(data: Path, args: argparse.Namespace, password: str, started: float,
          standalone: subprocess.Popen[str], log: Any, servers: list[Any]) -> dict[str, Any]:
    setup_django(data, args.gpu == "on", servers)
    from django.core.management import call_command

    from agents.models import AgentRun
    from infraops.experiments.workers import live_queues

    page_seconds = time.monotonic() - started
    queue = "experiments.gpu" if args.gpu == "on" else "experiments"
    while queue not in (live_queues() or set()):
        if time.monotonic() > started + 300 or standalone.poll() is not None:
            raise SystemExit(f"no live worker consumes {queue}")
        time.sleep(1)
    if args.fla:
        return drive_fla(args, password, started, page_seconds)
    call_command("start_runs", "demo-kernels", goal=[args.goal])
    run_started = time.monotonic()
    run = AgentRun.objects.filter(goal_version__goal__name=args.goal).first()
    if run is None:
        raise SystemExit(f"start_runs started no run on {args.goal!r} (its output above says why)")
    while not run.is_finished and time.monotonic() < started + args.deadline:
        time.sleep(2)
        run.refresh_from_db()
    run_seconds = time.monotonic() - run_started
    summary = describe(run)
    summary["pages"] = fetch_pages(args, password, run, summary)
    summary["figures"] = figures(summary, page_seconds, run_seconds)
    return summary


FLA_TARGETS = ("fla-kda", "fla-cp")


def drive_fla(args: argparse.Namespace, password: str, started: float, page_seconds: float
              ) -> dict[str, Any]:
    """Every goal of the flash-linear-attention targets, one run after the other until the
    deadline; each run described, its pages read, its figures named after its goal's target
    and policy."""
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from agents.models import AgentRun
    from agents.services import run_message_add
    from infraops.models import Boundary, Goal

    targets = args.fla_target or FLA_TARGETS
    goals = [goal for goal in Goal.objects.filter(target__name__in=targets)
             .select_related("target").order_by("target__name", "pk")
             if not args.fla_goal or any(text in goal.name for text in args.fla_goal)]
    admin = get_user_model().objects.get(username="admin")
    goals.sort(key=lambda goal: FLA_TARGETS.index(goal.target.name))
    if args.max_experiments is not None:
        Boundary.objects.filter(goal__in=goals, max_experiments__gt=args.max_experiments
                                ).update(max_experiments=args.max_experiments)
    runs = []
    for goal in goals:
        if time.monotonic() > started + args.deadline:
            break
        call_command("start_runs", goal.target.name, goal=[goal.name])
        run = AgentRun.objects.filter(goal_version__goal=goal).order_by("pk").last()
        if run is None:
            continue  # start_runs said why (no endpoint for an LLM goal, no GPU worker)
        steered = [message for target, message in args.steer if target == goal.target.name]
        for message in steered:
            run_message_add(run=run, user=admin, text=message)
        runs.append((run, time.monotonic(), steered))
        while not run.is_finished and time.monotonic() < started + args.deadline:
            time.sleep(5)
            run.refresh_from_db()
    if not runs:
        raise SystemExit("start_runs started no run on the fla targets (its output above says "
                         "why: is fla-core installed, is a GPU worker coming?)")
    described = []
    found: list[tuple[str, float, str]] = [("gpu_standalone_page_s", round(page_seconds, 1),
                                            "s")]
    for run, run_started, steered in runs:
        run.refresh_from_db()
        goal = run.goal_version.goal
        name = f"{goal.target.name}_{goal.policy}".replace("-", "_")
        summary = describe(run)
        summary["goal"] = {"target": goal.target.name, "name": goal.name,
                           "policy": goal.policy,
                           "max_experiments": run.goal_version.spec["boundary"]["max_experiments"]}
        summary["steered"] = steered
        summary["pages"] = fetch_pages(args, password, run, summary, prefix=name)
        seconds = ((run.finished_at - run.created_at).total_seconds()
                   if run.finished_at else time.monotonic() - run_started)
        summary["figures"] = [(f"{name}_{figure}", value, unit) for figure, value, unit in
                              figures(summary, page_seconds, seconds)
                              if figure != "gpu_standalone_page_s"]
        found += summary["figures"]
        described.append(summary)
    return {"runs": described, "figures": found, "max_experiments": args.max_experiments,
            "goals_kept": args.fla_goal}


def describe(run: Any) -> dict[str, Any]:
    """The run, its experiments (queue, worker, errors per length) and its change."""
    from reviews.models import Change

    experiments = []
    for experiment in run.experiments.order_by("pk"):
        errors = {f"{c['variant'] or 'default'} {c['case']}": (c["baseline_median"],
                                                                c["candidate_median"])
                  for c in (experiment.summary or {}).get("comparisons", [])
                  if c["metric"] == "rel_error"}
        executions = list(experiment.executions.order_by("pk").values(
            "probe", "side", "variant", "repeat_index", "exit_code", "wall_seconds"))
        comparisons = [
            [c["metric"], c.get("case") or "", c.get("variant") or "", c["baseline_median"],
             c["candidate_median"], c.get("verdict")]
            for c in (experiment.summary or {}).get("comparisons", [])]
        experiments.append({
            "comparisons": comparisons,
            "pk": experiment.pk, "status": experiment.status, "queue": experiment.queue,
            "probes": experiment.probes, "failure": experiment.failure_reason,
            "claimed_by": experiment.claimed_by, "executions": len(executions),
            "execution_seconds": sum(e["wall_seconds"] or 0 for e in executions),
            # Each execution's side, repeat (-1: a warm-up, or a compile cache's fill) and
            # seconds: what a compile cache saves is the fills' time against the samples'.
            "execution_times": [[e["side"], e["repeat_index"], round(e["wall_seconds"] or 0, 2)]
                                for e in executions],
            "rel_error_baseline_candidate": errors,
            "feedback": (experiment.feedback or {}).get("agent_text", "")[:6000],
            # Enough to replay the analysis where there is no GPU: what it was asked, every
            # sample with its execution, and the findings as stored.
            "criteria": experiment.criteria, "margin": experiment.margin,
            "margin_metric": experiment.margin_metric,
            "samples": [list(row) for row in experiment.samples.order_by("pk").values_list(
                "execution_id", "probe", "side", "variant", "metric", "value", "unit", "case")],
            "warmups": list(experiment.executions.filter(repeat_index__lt=0)
                            .values_list("pk", flat=True)),
            "findings": (experiment.feedback or {}).get("findings", []),
        })
    change = Change.objects.filter(runs=run).first()
    return {
        "run": {"pk": run.pk, "status": run.status, "stop_reason": run.stop_reason,
                "metric": run.goal_version.spec["metric"],
                "trials": run.state.get("trials", [])},
        "experiments": experiments,
        "change": None if change is None else {
            "pk": change.pk, "status": change.status, "risk_classes": change.risk_classes,
            "risk": change.risk, "diff": change.diff},
    }


def fetch_pages(args: argparse.Namespace, password: str, run: Any,
                summary: dict[str, Any], prefix: str = "") -> dict[str, int]:
    """Log in to the running web as admin and read the pages a user would open."""
    base = f"http://127.0.0.1:{args.port}"
    opener = urllib.request.build_opener(
        urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
    form = opener.open(f"{base}/accounts/login/", timeout=30).read().decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form)
    assert token, "no CSRF token on the login page"
    body = urllib.parse.urlencode({"username": "admin", "password": password,
                                   "csrfmiddlewaretoken": token[1]}).encode()
    request = urllib.request.Request(f"{base}/accounts/login/", data=body,
                                     headers={"Referer": f"{base}/accounts/login/"})
    opener.open(request, timeout=30).read()
    pages = {"dashboard": "/", "run": f"/runs/{run.pk}/", "queue": "/reviews/"}
    for experiment in summary["experiments"]:
        pages[f"experiment-{experiment['pk']}"] = f"/experiments/{experiment['pk']}/"
    if summary["change"]:
        pages["change"] = f"/reviews/changes/{summary['change']['pk']}/"
    statuses = {}
    for name, path in pages.items():
        with opener.open(f"{base}{path}", timeout=60) as response:
            statuses[name] = response.status
            (args.out / f"{prefix}{'-' if prefix else ''}{name}.html").write_bytes(
                response.read())
    return statuses


def figures(summary: dict[str, Any], page_seconds: float, run_seconds: float
            ) -> list[tuple[str, float, str]]:
    found: list[tuple[str, float, str]] = [
        ("gpu_standalone_page_s", round(page_seconds, 1), "s"),
        ("gpu_run_s", round(run_seconds, 1), "s"),  # the run, start to end, any policy
        ("gpu_experiments", len(summary["experiments"]), "count"),
        ("gpu_experiments_succeeded_on_the_gpu_queue", sum(
            1 for e in summary["experiments"]
            if e["queue"] == "experiments.gpu" and e["status"] == "succeeded"), "count")]
    trials = summary["run"]["trials"]
    metric = summary["run"].get("metric", "max_rel_error")  # the goal's
    if trials and trials[0].get("baseline") is not None:
        unit = "us" if "_us" in metric else "ms" if "_ms" in metric else "ratio"
        found.append((f"gpu_{metric}_base", trials[0]["baseline"], unit))
    for trial in trials:
        params = trial.get("params", {})
        value = params.get("input_precision")
        if value and trial.get("candidate") is not None:
            found.append((f"gpu_max_rel_error_{value}", trial["candidate"], "ratio"))
        elif params and trial.get("objective") is not None:  # the other targets' knobs
            shown = "_".join(f"{k}{v}" for k, v in sorted(params.items()))
            found.append((f"trial_{shown}_candidate_vs_base", trial["objective"], "ratio"))
    return found


if __name__ == "__main__":
    sys.exit(main())
