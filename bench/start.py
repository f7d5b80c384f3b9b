"""How long the README's first command takes to a page: a cold start from a fresh clone, and a
warm start after it.

    .venv/bin/python bench/start.py [--warm-only]

It clones this checkout's HEAD into a temporary folder and runs `scripts/standalone.sh` there
as a new user would (embedded PostgreSQL and Redis: DATABASE_URL and REDIS_URL are left out of
its environment), on a free port and a data folder of its own. The clock runs from the command
to the first answer of the login page. Cold: the clone has no virtual environment, so it
includes creating one and installing the pinned packages (Debian packages are installed once
per machine and are not timed again), the first migration, the first users and the example.
Then SIGTERM, and a warm start on the same clone and data: the setup finds everything in place.
--warm-only times a warm start of this checkout itself (its .venv) on a fresh data folder,
then a second one on the same data.

Figures: cold_start_s (bounded by the package install: it prints its progress), warm_start_s
(target <= 10), stop_s (SIGTERM to every process of the standalone's session gone: web,
workers), stop_leftover_processes (what was still running STOP_SECONDS after a SIGTERM, over
every stop; killed then, and named on stderr; target 0).

--warm-only is also the smoke run (tests/bench/test_bench_smoke.py): no clone, no install.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
READY_SECONDS = 600
STOP_SECONDS = 60


def figure(name: str, value: float, unit: str) -> None:
    print(f"figure: {name} {value:.4g} {unit}", flush=True)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start(checkout: Path, data: Path, log: Path) -> tuple[subprocess.Popen[bytes], float, int]:
    """The standalone running from `checkout` on `data`; seconds to its first page; its port."""
    port = free_port()
    env = {key: value for key, value in os.environ.items()
           if key not in ("DATABASE_URL", "REDIS_URL", "SECRET_KEY", "VIRTUAL_ENV")}
    env["INFRAOPS_DATA"] = str(data)
    started = time.monotonic()
    process = subprocess.Popen([str(checkout / "scripts" / "standalone.sh"), "--port", str(port)],
                               cwd=checkout, env=env, stdout=log.open("ab"),
                               stderr=subprocess.STDOUT, start_new_session=True)
    while time.monotonic() - started < READY_SECONDS:
        if process.poll() is not None:
            raise SystemExit(f"standalone exited ({process.returncode}):\n"
                             f"{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/accounts/login/",
                                        timeout=5) as response:
                if response.status == 200:
                    return process, time.monotonic() - started, port
        except (OSError, urllib.error.URLError):
            pass
        time.sleep(0.2)
    stop(process)
    raise SystemExit(f"no page within {READY_SECONDS} s:\n{log.read_text()[-3000:]}")


def session_processes(sid: int) -> list[psutil.Process]:
    """The live processes of session `sid` (the standalone's: it was started in its own)."""
    found = []
    for process in psutil.process_iter():
        try:
            if os.getsid(process.pid) == sid and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
        except (OSError, psutil.Error):
            continue
    return found


def stop(process: subprocess.Popen[bytes]) -> tuple[float, int]:
    """SIGTERM to the standalone: seconds until every process of its session is gone, and how
    many were still running after STOP_SECONDS (then killed)."""
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=STOP_SECONDS)
    while (left := session_processes(process.pid)) and time.monotonic() - started < STOP_SECONDS:
        time.sleep(0.1)
    seconds = time.monotonic() - started
    if left:
        named = "; ".join(f"{p.pid} {' '.join(p.cmdline()[:6])}" for p in left if p.is_running())
        print(f"still running {STOP_SECONDS} s after SIGTERM, killed: {named}", file=sys.stderr,
              flush=True)
        for leftover in left:
            with contextlib.suppress(psutil.Error):
                leftover.kill()
    if process.poll() is None:
        process.kill()
        process.wait()
    return seconds, len(left)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warm-only", action="store_true",
                        help="time this checkout's own warm starts, no fresh clone")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="infraops-start-"))
    log = work / "standalone.log"
    try:
        if args.warm_only:
            checkout = ROOT
            process, first, _ = start(checkout, work / "data", log)
            print(f"first start on a fresh data folder: {first:.1f} s", flush=True)
        else:
            checkout = work / "clone"
            subprocess.run(["git", "clone", "-q", str(ROOT), str(checkout)], check=True)
            process, cold, _ = start(checkout, work / "data", log)
            figure("cold_start_s", cold, "s")
        stopped, leftovers = stop(process)
        figure("stop_s", stopped, "s")
        process, warm, _ = start(checkout, work / "data", log)
        figure("warm_start_s", warm, "s")
        leftovers += stop(process)[1]
        figure("stop_leftover_processes", leftovers, "count")
        print("what the starts printed (uvicorn's and Celery's own lines left out):", flush=True)
        print("\n".join(f"  {line}" for line in log.read_text().splitlines()
                        if not line.startswith(("INFO:", "[", " ", "-", "."))
                        or line.startswith("  ...")), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
