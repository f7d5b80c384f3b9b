"""The live pages as a viewer gets them across a network: how soon a log line reaches ten
watchers, whether a watcher that drops five times loses a line, and what an experiment page
with charts costs a cold browser.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/<db> REDIS_URL=redis://127.0.0.1:6379/<n> \\
      .venv/bin/python bench/stream.py [--smoke]

Like bench/live_log.py it migrates DATABASE_URL's database, makes runs of its own there and
starts one uvicorn on it (after collectstatic, so static files are served hashed and gzipped as
in the standalone). Every client (websocket or browser) reaches the server through a TCP proxy
that delays each chunk BENCH_LATENCY_MS (default 20) one way: the network between a page and
the server.

- latency: BENCH_WATCHERS (10) sockets on one run while lines are appended at BENCH_RATE (50)
  lines/s for BENCH_SECONDS (20), one transaction each, through the product's own append. Each
  line carries the time it was committed; a watcher notes when its row arrived.
  `log_to_browser_p50_ms`, `log_to_browser_p95_ms` (target <= 100), over every line and watcher.
- loss: 10,000 lines appended while one watcher reads and is cut off at 5 random points,
  resuming each time as the page does ({"after": last}). `lines_lost` (0), `lines_duplicated`.
- page: Debian's Chromium, a fresh profile (cold cache), signed in, opens an experiment whose
  feedback has the A/B chart and waits until the chart is drawn. `experiment_page_first_load_ms`
  (navigation to chart drawn) and `experiment_page_bytes` (every response's size on the wire,
  as the browser's network log counts it; target <= 1.5 MB).

--smoke: 2 watchers for 1 s (50 lines), 300 lines for the loss and the page once, as always:
seconds, to show that it runs. The BENCH_ variables, where set, still win.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import os
import random
import re
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("SECRET_KEY", "bench-stream")
importlib.import_module("bench.live_log")  # sets Django up, with a data folder of its own

from django.core.management import call_command  # noqa: E402
from django.test import Client  # noqa: E402

from agents.events import run_events_append  # noqa: E402
from bench.live_log import (  # noqa: E402
    Reader,
    cleanup,
    make_run,
    read_with_cuts,
    remove_own_data,
    web_process,
)
from infraops.models import Experiment  # noqa: E402
from tests.agents.live_stream import (  # noqa: E402
    database_transcript,
    frame_rows,
)
from tests.e2e.conftest import CHROMIUM, free_port  # noqa: E402

LATENCY = float(os.environ.get("BENCH_LATENCY_MS", "20")) / 1000
WATCHERS = int(os.environ.get("BENCH_WATCHERS", "10"))
RATE = float(os.environ.get("BENCH_RATE", "50"))
SECONDS = float(os.environ.get("BENCH_SECONDS", "20"))
LOSS_LINES = 10_000
# --smoke: where the BENCH_ variables are not set.
SMOKE_WATCHERS = int(os.environ.get("BENCH_WATCHERS", "2"))
SMOKE_SECONDS = float(os.environ.get("BENCH_SECONDS", "1"))
SMOKE_LOSS_LINES = 300
STAMP = re.compile(r"sent at (\d+\.\d+)")


def figure(name: str, value: float, unit: str) -> None:
    print(f"figure: {name} {value:.4g} {unit}", flush=True)


class DelayProxy:
    """A TCP proxy that hands each chunk on `delay` seconds after it arrived, both ways, in
    order: a network with that one-way latency (and no bandwidth limit)."""

    def __init__(self, upstream: int, delay: float) -> None:
        self.upstream, self.delay, self.port = upstream, delay, free_port()

    async def serve(self) -> asyncio.Server:
        return await asyncio.start_server(self._client, "127.0.0.1", self.port)

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream)
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer),
                             return_exceptions=True)

    async def _pipe(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, chunk = await queue.get()
                await asyncio.sleep(max(due - time.monotonic(), 0))
                if not chunk:
                    break
                sink.write(chunk)
                await sink.drain()
            sink.close()

        sender = asyncio.ensure_future(deliver())
        try:
            while chunk := await source.read(65536):
                queue.put_nowait((time.monotonic() + self.delay, chunk))
        finally:
            queue.put_nowait((time.monotonic() + self.delay, b""))
            with contextlib.suppress(Exception):
                await sender


@contextlib.contextmanager
def proxied(port: int) -> Iterator[tuple[DelayProxy, asyncio.AbstractEventLoop]]:
    """The proxy running in a loop of its own thread (the clients run in others)."""
    loop = asyncio.new_event_loop()
    proxy = DelayProxy(port, LATENCY)
    server = loop.run_until_complete(proxy.serve())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield proxy, loop
    finally:
        loop.call_soon_threadsafe(server.close)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)


def produce_stamped(run_id: int, count: int, rate: float) -> None:
    began = time.monotonic()
    for n in range(count):
        run_events_append(run_id=run_id, entries=[
            ("status", f"line {n:05d} sent at {time.time():.6f}", None)])
        ahead = (n + 1) / rate - (time.monotonic() - began)
        if ahead > 0:
            time.sleep(ahead)


async def watch(reader: Reader, last: int, arrivals: list[float]) -> None:
    """Read until row `last`, noting how long after its commit each row arrived."""
    while not reader.rows or reader.rows[-1][0] < last:
        socket = reader.socket or await reader.open()
        frame = str(await asyncio.wait_for(socket.recv(), timeout=120))
        now = time.time()
        got = frame_rows(frame)
        reader.rows += got
        arrivals += [now - float(m.group(1)) for _, text in got if (m := STAMP.search(text))]
    await reader.drop()


async def latency(port: int, run_id: int, cookie: str, watchers: int = WATCHERS,
                  seconds: float = SECONDS) -> None:
    readers = [Reader(port, run_id, cookie) for _ in range(watchers)]
    for reader in readers:
        await reader.open()
    count = int(RATE * seconds)
    arrivals: list[float] = []
    producer = asyncio.ensure_future(asyncio.to_thread(produce_stamped, run_id, count, RATE))
    await asyncio.gather(*(watch(reader, count, arrivals) for reader in readers))
    await producer
    ordered = sorted(arrivals)
    figure("stream_simulated_latency_ms", LATENCY * 1000, "ms one way")
    figure("log_to_browser_lines_measured", len(ordered), "lines x watchers")
    figure("log_to_browser_p50_ms", statistics.median(ordered) * 1000, "ms")
    figure("log_to_browser_p95_ms", ordered[max(0, round(0.95 * len(ordered)) - 1)] * 1000,
           "ms")


async def loss(port: int, run_id: int, cookie: str, lines: int = LOSS_LINES) -> None:
    reader, cuts = await read_with_cuts(port, run_id, cookie, lines)
    seen = [seq for seq, _ in reader.rows]
    stored = [seq for seq, _ in await asyncio.to_thread(database_transcript, run_id)]
    figure("stream_forced_disconnects", len(cuts), "count")
    figure("lines_lost", len(set(stored) - set(seen)), "lines")
    figure("lines_duplicated", len(seen) - len(set(seen)), "lines")


def experiment_with_charts(run_target_id: int) -> Experiment:
    rng = random.Random(7)
    base = [10 + rng.gauss(0, 0.3) for _ in range(10)]
    head = [9 + rng.gauss(0, 0.3) for _ in range(10)]
    return Experiment.objects.create(
        target_id=run_target_id, candidate_commit="b" * 40, baseline_commit="a" * 40,
        status=Experiment.Status.SUCCEEDED, probes=["latency-bench"],
        feedback={"verdict": "improved", "counts": {"pass": 1, "fail": 0, "warn": 0, "info": 0},
                  "findings": [{"severity": "pass", "layer": "performance",
                                "title": "latency-bench latency_ms improved",
                                "detail": "median 10 -> 9 ms", "evidence": {}}],
                  "distributions": [{"label": "latency-bench latency_ms", "baseline": base,
                                     "candidate": head}]})


def page_load(port: int, experiment_id: int, session: str) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync"])
        context = browser.new_context()  # a fresh profile: nothing cached
        context.add_cookies([{"name": "sessionid", "value": session, "domain": "127.0.0.1",
                              "path": "/"}])
        page = context.new_page()
        network = context.new_cdp_session(page)
        network.send("Network.enable")
        wire: list[float] = []
        network.on("Network.loadingFinished",
                   lambda event: wire.append(float(event.get("encodedDataLength", 0))))
        began = time.monotonic()
        page.goto(f"http://127.0.0.1:{port}/experiments/{experiment_id}/")
        page.locator("#chart-ab .main-svg").first.wait_for(state="visible", timeout=60_000)
        drawn = time.monotonic() - began
        page.wait_for_load_state("networkidle")
        figure("experiment_page_first_load_ms", drawn * 1000, "ms")
        figure("experiment_page_bytes", sum(wire), "bytes")
        figure("experiment_page_requests", len(wire), "requests")
        browser.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true",
                        help="2 watchers for 1 s, 300 lines lost or not, the page once")
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    call_command("collectstatic", interactive=False, verbosity=0)
    with tempfile.TemporaryDirectory(prefix="bench-stream-") as work:
        runs = []
        try:
            for name in ("latency", "loss"):
                (Path(work) / name).mkdir()
                runs.append(make_run(Path(work) / name))
            (run, user), (loss_run, _) = runs
            client = Client()
            client.force_login(user)
            session = client.cookies["sessionid"].value
            cookie = f"sessionid={session}"
            with web_process(Path(work) / "web.log") as (port, _web), \
                    proxied(port) as (proxy, _loop):
                if args.smoke:
                    asyncio.run(latency(proxy.port, run.pk, cookie, SMOKE_WATCHERS,
                                        SMOKE_SECONDS))
                    asyncio.run(loss(proxy.port, loss_run.pk, cookie, SMOKE_LOSS_LINES))
                else:
                    asyncio.run(latency(proxy.port, run.pk, cookie))
                    asyncio.run(loss(proxy.port, loss_run.pk, cookie))
                experiment = experiment_with_charts(run.target_id)
                page_load(proxy.port, experiment.pk, session)
                experiment.delete()
        finally:
            for made, _ in runs:
                cleanup(made)
            remove_own_data()


if __name__ == "__main__":
    main()
