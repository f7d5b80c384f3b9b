"""A model endpoint that accepts and never answers, against a real agent worker of one process:
each step holds the process for one request of INFRAOPS_LLM_TIMEOUT, the retries are the step
re-scheduled (another run's step takes the process in between), and the run pauses, saying
why, at the first failure after INFRAOPS_LLM_RETRY_SECONDS counted from the first failure:
within the window and one timeout."""

from __future__ import annotations

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
from agents.services import run_start
from infraops.models import Goal
from infraops.project.celery import app as celery_app
from tests.infraops.workers_harness import started_workers, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

TIMEOUT = 1  # INFRAOPS_LLM_TIMEOUT of the worker, seconds
WINDOW = 6  # INFRAOPS_LLM_RETRY_SECONDS of the worker


@dataclass
class Connection:
    accepted: datetime
    closed: datetime | None = None  # when the client gave up: the server never answers


@dataclass
class HungEndpoint:
    """A socket server that reads every request and never writes a byte."""

    listener: socket.socket
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

    @staticmethod
    def _hold(client: socket.socket, record: Connection) -> None:
        with client:
            while client.recv(65536):
                pass
            record.closed = datetime.now(UTC)


@pytest.fixture
def hung_endpoint() -> Iterator[HungEndpoint]:
    listener = socket.create_server(("127.0.0.1", 0))
    endpoint = HungEndpoint(listener)
    threading.Thread(target=endpoint.serve, daemon=True).start()
    yield endpoint
    listener.close()


def test_a_hung_endpoint_pauses_the_run_within_the_window_and_one_timeout_and_frees_the_worker(
    hung_endpoint: HungEndpoint, llm_goal: Callable[..., Goal], example_goal: Goal,
    engineer: User, data_dir: Path, tmp_path: Path, settings: Any,
) -> None:
    settings.OPENAI_BASE_URL = hung_endpoint.base_url
    settings.INFRAOPS_MODEL = "stub-model"
    celery_app.control.purge()  # nothing an earlier test of this process queued
    with started_workers(data_dir, tmp_path, settings.REDIS_URL) as workers:
        workers.start(["agent"], concurrency=1, label="hang", env={
            "OPENAI_BASE_URL": hung_endpoint.base_url, "INFRAOPS_MODEL": "stub-model",
            "INFRAOPS_LLM_TIMEOUT": str(TIMEOUT), "INFRAOPS_LLM_RETRY_SECONDS": str(WINDOW)})
        run = run_start(goal=llm_goal(), user=engineer)
        wait_until(lambda: hung_endpoint.connections, timeout=60, what="the first request")
        # A second run on the same one-process worker, started while the first one hangs.
        other = run_start(goal=example_goal, user=engineer)
        wait_until(lambda: AgentRun.objects.filter(pk=run.pk, status="paused").exists(),
                   timeout=120, interval=0.2, what="the run to pause")
        wait_until(lambda: Step.objects.filter(run=other).exists(), timeout=60,
                   what="the other run's first step")
        # The endpoint's threads note each close when they next run: on a loaded machine,
        # after the worker has moved on.
        wait_until(lambda: all(c.closed is not None for c in hung_endpoint.connections),
                   timeout=60, what="the endpoint to see every request closed")
    run.refresh_from_db()
    connections = hung_endpoint.connections
    first_failure = connections[0].closed
    paused_at = run.events.filter(kind="status", data__status="paused").get().created_at

    assert f"did not answer within {TIMEOUT} s" in run.stop_reason
    assert f"({len(connections)} tries)" in run.stop_reason
    assert run.stop_reason.endswith("Resume retries")
    assert run.step_count == 0  # the model was never reached: no step spent
    # Each request was given up by the client after one timeout: nothing else ends them.
    assert all(c.closed is not None and c.closed - c.accepted >= timedelta(seconds=TIMEOUT * 0.9)
               for c in connections), connections
    # The window counts from the first failure: no pause before it ends, and the run paused
    # at the first failure after it: at most one request started past the window's end.
    assert first_failure is not None
    window_end = first_failure + timedelta(seconds=WINDOW)
    assert paused_at >= window_end
    assert sum(c.accepted >= window_end for c in connections) <= 1, connections
    assert len(connections) >= 3  # retried inside the window, with the step re-scheduled
    # Between two requests the worker's only process was free: the other run's step ran there.
    other_step = Step.objects.filter(run=other).earliest("created_at").created_at
    assert other_step < connections[-1].accepted, (other_step, connections)
    waits = list(run.events.filter(kind="wait").order_by("seq"))
    assert [w.data["attempt"] for w in waits] == list(range(1, len(connections)))
