"""infraops/project/celery.py: what a worker process does around its tasks.

Database connections are kept from one task to the next while healthy (a new one per task cost
4-5 ms of every experiment) and replaced when broken; a process that runs experiments checks its
sandbox when it starts."""

from __future__ import annotations

import logging

import psycopg
import pytest
from celery.fixups.django import DjangoWorkerFixup
from django.db import connection

from infraops.experiments import sandbox
from infraops.project import celery as worker_process
from infraops.tasks import experiment_execute


def backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        row = cursor.fetchone()
    assert row is not None
    return int(row[0])


def around_a_task(fixup: DjangoWorkerFixup) -> None:
    """What Celery sends around each task: its Django fixup's receivers and ours."""
    fixup.on_task_prerun(sender=experiment_execute)
    worker_process._recycle_database_connections()
    fixup.on_task_postrun(sender=experiment_execute)
    worker_process._recycle_database_connections()


@pytest.fixture
def as_a_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process's connection set up as a worker's is (infraops.project.settings: CONN_MAX_AGE 60
    for `celery worker`, 0 for tests like this one), from a fresh connect."""
    monkeypatch.setitem(connection.settings_dict, "CONN_MAX_AGE", 60)
    connection.close()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("as_a_worker")
def test_a_healthy_connection_serves_the_next_task() -> None:
    fixup = DjangoWorkerFixup(worker_process.app)
    first = backend_pid()
    around_a_task(fixup)
    around_a_task(fixup)
    assert backend_pid() == first


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("as_a_worker")
def test_a_connection_the_server_dropped_is_replaced_before_the_next_task() -> None:
    fixup = DjangoWorkerFixup(worker_process.app)
    first = backend_pid()
    params = connection.get_connection_params()
    with psycopg.connect(**params, autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(%s)", [first])
    around_a_task(fixup)
    assert backend_pid() != first  # no error: the health check replaced it


@pytest.mark.parametrize(("queues", "checked"), [
    (["experiments"], True), (["experiments.gpu"], True), (["agent"], False),
])
def test_a_process_that_runs_experiments_says_at_start_when_it_cannot_confine_probes(
    queues: list[str], checked: bool, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: list[bool] = []

    def broken() -> str:
        calls.append(True)
        return "bubblewrap (bwrap) is not installed: apt-get install bubblewrap."

    monkeypatch.setattr(sandbox, "sandbox_check", broken)
    # What `celery worker -Q ...` selects before it forks its pool.
    monkeypatch.setattr(worker_process.app.amqp.queues, "_consume_from",
                        {name: object() for name in queues})
    caplog.set_level(logging.ERROR, logger="infraops.project.celery")
    worker_process._check_sandbox_early()
    assert calls == ([True] if checked else [])
    messages = [r.getMessage() for r in caplog.records]
    assert messages == (["this worker cannot run probes: bubblewrap (bwrap) is not installed: "
                         "apt-get install bubblewrap."] if checked else [])
