"""A run's live log over a real socket: a slow client under a flood, and a client that drops
and resumes (docs/reliability.md W4 and W3).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/<db> REDIS_URL=redis://127.0.0.1:6379/<n> \\
      .venv/bin/python bench/live_log.py [--smoke]

It migrates DATABASE_URL's database, makes a run of its own there (deleted at the end) and
starts one uvicorn on it as `manage.py standalone` does. The client speaks the protocol of
static/js/live-log.js: on every (re)connect `{"after": <last row it has>}`.

- flood (W4): a producer appends BENCH_FLOOD_RATE lines/s (default 10,000, in transactions of
  500 lines through agents.events.run_events_append) for BENCH_FLOOD_SECONDS (10) while the
  client reads ten times slower. Figures: the web process's RSS growth from the connected
  socket to the peak (`ws_flood_server_rss_growth_mib`, target < 100), the transcript
  (`ws_flood_transcript_complete_pct`, 100, with `_missing` and `_duplicates` 0), and the
  tracebacks in the web process's log (`ws_flood_server_exceptions`, 0).
- replay (W3): BENCH_REPLAY_LINES (10,000) appended while the client reads, dropping the
  socket at 5 random points and resuming: `ws_replay_gaps`, `ws_replay_duplicates` (0 each),
  `ws_replay_matches_database` (1).

--smoke: one transaction of 500 lines at 5,000 lines/s for the flood (the client catches up in
about a second) and 300 lines with the 5 cuts for the replay: seconds, to show that it runs.
The BENCH_ variables, where set, still win.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "infraops.project.settings")
os.environ.setdefault("SECRET_KEY", "bench-live-log")
OWN_DATA: str | None = None
if "INFRAOPS_DATA" not in os.environ:  # a data folder of its own, removed by remove_own_data
    OWN_DATA = os.environ["INFRAOPS_DATA"] = tempfile.mkdtemp(prefix="bench-live-log-")

import django  # noqa: E402

django.setup()

from django.contrib.auth.models import User  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.test import Client  # noqa: E402
from websockets.asyncio.client import ClientConnection, connect  # noqa: E402
from websockets.exceptions import ConnectionClosed  # noqa: E402

from agents.models import AgentRun  # noqa: E402
from infraops.models import Goal, GoalVersion, Target  # noqa: E402
from infraops.services.goals import goal_snapshot  # noqa: E402
from infraops.services.targets import target_register  # noqa: E402
from tests.agents.live_stream import append_lines, database_transcript, frame_rows  # noqa: E402
from tests.conftest import UserFactory, make_origin, members_of_new_target  # noqa: E402
from tests.e2e.conftest import _wait_for, free_port, stop_processes  # noqa: E402

FLOOD_RATE = int(os.environ.get("BENCH_FLOOD_RATE", "10000"))
FLOOD_SECONDS = float(os.environ.get("BENCH_FLOOD_SECONDS", "10"))
REPLAY_LINES = int(os.environ.get("BENCH_REPLAY_LINES", "10000"))
# --smoke: where the BENCH_ variables are not set.
SMOKE = {"BENCH_FLOOD_RATE": 5000, "BENCH_FLOOD_SECONDS": 0.1, "BENCH_REPLAY_LINES": 300}
BATCH = 500
SLOWDOWN = 10  # the slow client reads this many times slower than the producer writes

Rows = list[tuple[int, str]]


def figure(name: str, value: float, unit: str) -> None:
    print(f"figure: {name} {value:g} {unit}", flush=True)


def make_run(work: Path) -> tuple[AgentRun, User]:
    suffix = os.urandom(4).hex()
    engineer = UserFactory.create(username=f"bench-live-{suffix}", roles=["engineer"])
    # The engineer joins the target (as load_example makes its users): sockets are per target.
    target = members_of_new_target(target_register(
        name=f"bench-live-{suffix}", repo_url=str(make_origin(work)), base_branch="main",
        push_on_merge=False, trusted_roots=[work]))
    goal = Goal.objects.create(target=target, name="latency", probe="latency-bench",
                               metric="latency_ms", direction="minimize", relative_target=0.1,
                               owner=engineer)
    version = goal_snapshot(goal=goal, user=engineer)
    run = AgentRun.objects.create(goal_version=version, target=target, policy=goal.policy,
                                  started_by=engineer, base_commit=target.manifest_commit,
                                  manifest_sha256=target.manifest_sha256)
    return run, engineer


@contextmanager
def web_process(log_path: Path) -> Iterator[tuple[int, psutil.Process]]:
    port = free_port()
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "infraops.project.asgi:application", "--host",
             "127.0.0.1", "--port", str(port), "--no-access-log"],
            cwd=ROOT, env=dict(os.environ), stdout=log, stderr=subprocess.STDOUT)
        try:
            _wait_for(f"http://127.0.0.1:{port}/healthz", [process])
            yield port, psutil.Process(process.pid)
        finally:
            stop_processes([process])


class Peak:
    """The highest RSS of a process, sampled every 50 ms in a thread."""

    def __init__(self, process: psutil.Process) -> None:
        self.process, self._stop = process, False
        self.peak: int = process.memory_info().rss
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop:
            self.peak = max(self.peak, self.process.memory_info().rss)
            time.sleep(0.05)

    def stop(self) -> int:
        self._stop = True
        self._thread.join()
        return self.peak


class Reader:
    """A page's live log: the rows it has, and a socket that resumes after the last of them
    when it is closed (by the bench, or by the server: uvicorn closes a socket whose client
    is too far behind to answer its ping, and the page's htmx reconnects)."""

    def __init__(self, port: int, run_id: int, cookie: str) -> None:
        self.url = f"ws://127.0.0.1:{port}/ws/runs/{run_id}/"
        self.headers = {"Cookie": cookie, "Origin": f"http://127.0.0.1:{port}"}
        self.rows: Rows = []
        self.socket: ClientConnection | None = None
        self.reconnects = 0

    async def open(self) -> ClientConnection:
        # max_queue=4: a slow reader stops reading the TCP socket, so the server's sends wait
        # (a browser would buffer without bound instead). No client pings, as a browser.
        socket = await connect(self.url, max_queue=4, ping_interval=None,
                               additional_headers=self.headers)
        await socket.send(json.dumps({"after": self.rows[-1][0] if self.rows else 0}))
        self.socket = socket
        return socket

    async def drop(self) -> None:
        """Close the socket; frames still on their way are lost."""
        if self.socket is not None:
            await self.socket.close()
            self.socket = None

    async def read_through(self, last: Callable[[], int | None], lines_per_s: float = 0.0
                           ) -> None:
        """Frames until row last() is here (None: not known yet, read on), at most
        `lines_per_s` when it is set."""
        while (wanted := last()) is None or not self.rows or self.rows[-1][0] < wanted:
            socket = self.socket or await self.open()
            try:
                frame = await asyncio.wait_for(socket.recv(), timeout=120)
            except ConnectionClosed:
                self.socket = None
                self.reconnects += 1
                continue
            got = frame_rows(str(frame))
            self.rows += got
            if lines_per_s:
                await asyncio.sleep(len(got) / lines_per_s)


def produce(run_id: int, rate: int, seconds: float, start: int) -> int:
    """Lines at `rate` per second for `seconds`, in transactions of BATCH; the count written."""
    began, written = time.monotonic(), 0
    while time.monotonic() - began < seconds:
        append_lines(run_id, BATCH, start + written, batch=BATCH)
        written += BATCH
        ahead = written / rate - (time.monotonic() - began)
        if ahead > 0:
            time.sleep(ahead)
    figure("ws_flood_producer_lines_per_s", round(written / (time.monotonic() - began)),
           "lines/s")
    return written


def tracebacks(log_path: Path) -> int:
    return log_path.read_text(errors="replace").count("Traceback")


async def flood(port: int, web: psutil.Process, run: AgentRun, cookie: str,
                log_path: Path, rate: int = FLOOD_RATE, seconds: float = FLOOD_SECONDS) -> None:
    reader = Reader(port, run.pk, cookie)
    await asyncio.to_thread(append_lines, run.pk, 1)
    await reader.read_through(lambda: 1)
    base, peak = web.memory_info().rss, Peak(web)
    end: list[int] = []
    producer = asyncio.ensure_future(asyncio.to_thread(produce, run.pk, rate, seconds, 1))
    producer.add_done_callback(lambda done: end.append(1 + done.result()))
    began = time.monotonic()
    await reader.read_through(lambda: end[0] if end else None, rate / SLOWDOWN)
    figure("ws_flood_client_catch_up_s", round(time.monotonic() - began, 1), "s")
    figure("ws_flood_reconnects", reader.reconnects, "count")
    await reader.drop()
    figure("ws_flood_server_rss_growth_mib", round((peak.stop() - base) / 2**20, 1), "MiB")
    report("ws_flood", reader.rows, await asyncio.to_thread(database_transcript, run.pk))
    figure("ws_flood_server_exceptions", tracebacks(log_path), "count")


def report(prefix: str, rows: Rows, stored: Rows) -> None:
    seen = [seq for seq, _ in rows]
    wanted = [seq for seq, _ in stored]
    missing = len(set(wanted) - set(seen))
    figure(f"{prefix}_lines", len(wanted), "lines")
    figure(f"{prefix}_transcript_complete_pct", round(100 * (1 - missing / len(wanted)), 3), "%")
    figure(f"{prefix}_missing", missing, "lines")
    figure(f"{prefix}_duplicates", len(seen) - len(set(seen)), "lines")
    figure(f"{prefix}_matches_database", int(rows == stored), "bool")


async def read_with_cuts(port: int, run_id: int, cookie: str, lines: int,
                         cuts: int = 5) -> tuple[Reader, list[int]]:
    """`lines` appended while a reader reads, its socket dropped after `cuts` random rows
    and resumed each time; the reader (with every row it got) and the cut points."""
    points = sorted(random.Random().sample(range(1, lines), cuts))
    producer = asyncio.ensure_future(asyncio.to_thread(append_lines, run_id, lines, 0, 10))
    reader = Reader(port, run_id, cookie)
    for cut in points:
        await reader.read_through(lambda c=cut: c)  # type: ignore[misc]
        await reader.drop()
    await reader.read_through(lambda: lines)
    await reader.drop()
    await producer
    return reader, points


async def replay(port: int, run: AgentRun, cookie: str, lines: int = REPLAY_LINES) -> None:
    reader, cuts = await read_with_cuts(port, run.pk, cookie, lines)
    seen = [seq for seq, _ in reader.rows]
    gaps = sum(1 for a, b in itertools.pairwise(seen) if b > a + 1)
    figure("ws_replay_disconnects", len(cuts) + reader.reconnects, "count")
    figure("ws_replay_gaps", gaps + (seen[0] != 1), "count")
    report("ws_replay", reader.rows, await asyncio.to_thread(database_transcript, run.pk))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true",
                        help="a tiny flood and replay (seconds): it runs, the figures mean little")
    args = parser.parse_args()

    def size(name: str, full: float) -> float:
        return float(os.environ.get(name, SMOKE[name])) if args.smoke else full

    rate = int(size("BENCH_FLOOD_RATE", FLOOD_RATE))
    seconds = size("BENCH_FLOOD_SECONDS", FLOOD_SECONDS)
    lines = int(size("BENCH_REPLAY_LINES", REPLAY_LINES))
    call_command("migrate", verbosity=0)
    with tempfile.TemporaryDirectory(prefix="bench-live-log-") as work:
        run, user = make_run(Path(work))
        client = Client()
        client.force_login(user)
        cookie = f"sessionid={client.cookies['sessionid'].value}"
        log_path = Path(work) / "web.log"
        try:
            with web_process(log_path) as (port, web):
                asyncio.run(flood(port, web, run, cookie, log_path, rate, seconds))
                (Path(work) / "replay").mkdir()
                replay_run, _ = make_run(Path(work) / "replay")
                try:
                    asyncio.run(replay(port, replay_run, cookie, lines))
                finally:
                    cleanup(replay_run)
        finally:
            cleanup(run)  # the user stays: the audit log names it, and refuses a delete
            remove_own_data()


def remove_own_data() -> None:
    """Remove the data folder made at import, if one was."""
    if OWN_DATA is not None:
        shutil.rmtree(OWN_DATA, ignore_errors=True)


def cleanup(run: AgentRun) -> None:
    target: Target = run.target
    run.delete()
    GoalVersion.objects.filter(goal__target=target).delete()
    Goal.objects.filter(target=target).delete()
    target.delete()


if __name__ == "__main__":
    main()
