"""A model endpoint that never answers, trickles its answer, or rate-limits every request,
against a real agent worker of one process: each step holds the process for one request of
INFRAOPS_LLM_TIMEOUT at the most, the retries are the step re-scheduled (another run's step
takes the process in between), and the run pauses, saying why, at the first failure after
INFRAOPS_LLM_RETRY_SECONDS counted from the first failure: within the window and one
timeout."""

from __future__ import annotations

import re
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from agents.models import AgentRun, Step
from agents.scripted.endpoint import OpenAIStub, ReceivedRequest, StubReply, rate_limited
from agents.services import run_start
from infraops.models import Goal
from infraops.project.celery import app as celery_app
from tests.infraops.workers_harness import started_workers, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

# A trickled byte comes every TRICKLE_EVERY seconds, well within any per-read timeout of the
# trickle case's INFRAOPS_LLM_TIMEOUT: only a deadline for the whole request cuts it off.
TRICKLE_EVERY = 1.0


@dataclass
class Connection:
    accepted: datetime
    closed: datetime | None = None  # when the client gave up: the server never finishes


@dataclass
class HungEndpoint:
    """A socket server that reads every request and never finishes an answer: it writes
    nothing (`trickle_every` None), or a response head and then a byte of its body every
    `trickle_every` seconds, for as long as the client stays."""

    listener: socket.socket
    trickle_every: float | None = None
    connections: list[Connection] = field(default_factory=list)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.listener.getsockname()[1]}/v1"

    def serve(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # the listener was closed: the test is over
            record = Connection(datetime.now(UTC))
            self.connections.append(record)
            threading.Thread(target=self._hold, args=(client, record), daemon=True).start()

    def _hold(self, client: socket.socket, record: Connection) -> None:
        with client:
            if self.trickle_every is None:
                while client.recv(65536):
                    pass
            else:
                self._trickle(client, self.trickle_every)
            record.closed = datetime.now(UTC)

    @staticmethod
    def _trickle(client: socket.socket, every: float) -> None:
        """A 200 whose body never ends, a byte at a time; the client's hang-up is seen within
        a twentieth of a second (a read that returns nothing), not at the next byte."""
        client.recv(65536)
        client.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                       b"Content-Length: 1000000\r\n\r\n")
        client.settimeout(0.05)
        ticks = round(every / 0.05)
        try:
            for tick in range(10**9):
                if tick % ticks == 0:
                    client.sendall(b" ")
                try:
                    if not client.recv(65536):
                        return
                except TimeoutError:
                    continue
        except OSError:
            return  # the client reset the connection


@pytest.fixture
def hung_endpoint(request: pytest.FixtureRequest) -> Iterator[HungEndpoint]:
    listener = socket.create_server(("127.0.0.1", 0))
    endpoint = HungEndpoint(listener, getattr(request, "param", None))
    threading.Thread(target=endpoint.serve, daemon=True).start()
    yield endpoint
    listener.close()


def run_on_one_process(
    base_url: str, *, timeout: float, window: float, asked: Callable[[], object],
    llm_goal: Callable[..., Goal], example_goal: Goal, engineer: User, data_dir: Path,
    tmp_path: Path, settings: Any,
) -> tuple[AgentRun, AgentRun]:
    """An LLM run against `base_url` on a real agent worker of one process, until it pauses;
    a tuner run started once the endpoint was first `asked`, on the same process, until its
    first step. Returns both, read again."""
    settings.OPENAI_BASE_URL = base_url
    settings.INFRAOPS_MODEL = "stub-model"
    celery_app.control.purge()  # nothing an earlier test of this process queued
    with started_workers(data_dir, tmp_path, settings.REDIS_URL) as workers:
        workers.start(["agent"], concurrency=1, label="hang", env={
            "OPENAI_BASE_URL": base_url, "INFRAOPS_MODEL": "stub-model",
            "INFRAOPS_LLM_TIMEOUT": str(timeout), "INFRAOPS_LLM_RETRY_SECONDS": str(window)})
        run = run_start(goal=llm_goal(), user=engineer)
        wait_until(asked, timeout=60, what="the first request")
        # A second run on the same one-process worker, started while the first one waits.
        other = run_start(goal=example_goal, user=engineer)
        wait_until(lambda: AgentRun.objects.filter(pk=run.pk, status="paused").exists(),
                   timeout=180, interval=0.2, what="the run to pause")
        wait_until(lambda: Step.objects.filter(run=other).exists(), timeout=60,
                   what="the other run's first step")
    run.refresh_from_db()
    return run, other


def paused_at(run: AgentRun) -> datetime:
    return run.events.filter(kind="status", data__status="paused").get().created_at


def first_step_of(run: AgentRun) -> datetime:
    return Step.objects.filter(run=run).earliest("created_at").created_at


@pytest.mark.parametrize(("hung_endpoint", "timeout", "window"),
                         [(None, 1, 6), (TRICKLE_EVERY, 3, 12)],
                         ids=["never-answers", "trickles-a-byte-a-second"],
                         indirect=["hung_endpoint"])
def test_a_hung_endpoint_pauses_the_run_within_the_window_and_one_timeout_and_frees_the_worker(
    hung_endpoint: HungEndpoint, timeout: int, window: int, llm_goal: Callable[..., Goal],
    example_goal: Goal, engineer: User, data_dir: Path, tmp_path: Path, settings: Any,
) -> None:
    run, other = run_on_one_process(
        hung_endpoint.base_url, timeout=timeout, window=window,
        asked=lambda: hung_endpoint.connections, llm_goal=llm_goal, example_goal=example_goal,
        engineer=engineer, data_dir=data_dir, tmp_path=tmp_path, settings=settings)
    connections = hung_endpoint.connections
    # The stub's accept thread may take a connection the kernel accepted a while after the run
    # paused (a loaded machine once left it at 2 of 3): wait for it to see every try the run
    # counts; a run that counts a try it never made still fails below.
    said = re.search(r"\((\d+) tries\)", run.stop_reason)
    assert said, run.stop_reason
    wait_until(lambda: len(connections) >= int(said.group(1)), timeout=30,
               what="the stub to record every request the run made")
    # The server never ends a request: each one ends when the client hangs up.
    wait_until(lambda: all(c.closed is not None for c in connections), timeout=30,
               what="the client to hang up every request")
    first_failure = connections[0].closed

    assert f"did not answer within {timeout} s" in run.stop_reason
    assert f"({len(connections)} tries)" in run.stop_reason
    assert run.stop_reason.endswith("Resume retries")
    assert run.step_count == 0  # the model was never reached: no step spent
    # The window counts from the first failure: no pause before it ends, and the run paused
    # at the first failure after it: at most one request started past the window's end.
    assert first_failure is not None
    window_end = first_failure + timedelta(seconds=window)
    assert paused_at(run) >= window_end
    assert sum(c.accepted >= window_end for c in connections) <= 1, connections
    assert len(connections) >= 3  # retried inside the window, with the step re-scheduled
    # Between two requests the worker's only process was free: the other run's step ran there.
    assert first_step_of(other) < connections[-1].accepted, (first_step_of(other), connections)
    waits = list(run.events.filter(kind="wait").order_by("seq"))
    assert [w.data["attempt"] for w in waits] == list(range(1, len(connections)))


@pytest.mark.parametrize("retry_after", [1, None], ids=["retry-after-1s", "no-retry-after"])
def test_a_storm_of_429s_pauses_the_run_within_the_window_and_no_worker_sleeps(
    retry_after: float | None, llm_goal: Callable[..., Goal], example_goal: Goal,
    engineer: User, data_dir: Path, tmp_path: Path, settings: Any,
) -> None:
    """Every answer a 429 (an account out of quota): each wait is the step re-scheduled, none
    goes past the window's end (without Retry-After the server's default wait, 30 s, would),
    and the run pauses in words at the first 429 after it. (The request timeout is long: a
    loaded machine once kept the stub from answering within 5 s, which is another fault.)"""
    window = 6
    arrived: list[datetime] = []

    def always_429(request: ReceivedRequest) -> StubReply:
        arrived.append(datetime.now(UTC))
        return rate_limited(retry_after)

    with OpenAIStub(fallback=always_429) as endpoint:
        run, other = run_on_one_process(
            endpoint.base_url, timeout=30, window=window, asked=lambda: arrived,
            llm_goal=llm_goal, example_goal=example_goal, engineer=engineer,
            data_dir=data_dir, tmp_path=tmp_path, settings=settings)

    assert run.stop_reason.startswith("the model endpoint has rate-limited every request for "), (
        run.stop_reason, arrived)
    assert f"({len(arrived)} tries)" in run.stop_reason and "429" in run.stop_reason
    assert run.stop_reason.endswith("Resume retries")
    assert run.step_count == 0
    # The window starts at the first 429 (after it arrived): the pause comes after its end,
    # at the first 429 past it, so no more than one request came after it.
    window_end = arrived[0] + timedelta(seconds=window)
    assert paused_at(run) >= window_end
    assert sum(at >= window_end for at in arrived) <= 1, arrived
    assert len(arrived) >= 2
    # The worker's only process was free between two 429s: the other run's step ran there.
    assert first_step_of(other) < arrived[-1], (first_step_of(other), arrived)
    # One request per step task, each wait an event: none was slept in the worker.
    first_wait = run.events.filter(kind="wait").earliest("seq")
    assert first_wait.data["attempt"] == 0 and "429" in first_wait.data["reason"]
    asked_for = retry_after if retry_after is not None else window  # 30 s, cut to the window
    assert 0 < first_wait.data["retry_in"] <= asked_for
