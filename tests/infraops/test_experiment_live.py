"""The experiment page is live to its end: when the experiment's state moves, its socket has
the page re-read status, feedback, charts and tables; a page that missed the move (it loaded
while the experiment finished, or its socket was down) re-reads them when it reconnects."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.templatetags.static import static
from django.test import Client

from infraops.experiments.services import experiment_claim
from infraops.models import Experiment, ExperimentLog, Target
from infraops.project.asgi import application
from infraops.signals import experiment_finished
from tests.factories import ExperimentFactory

TIMEOUT = 15  # generous: a first socket of a session warms templates and connections
REFRESHED = ("experiment-status", "experiment-alerts", "experiment-feedback",
             "experiment-comparison", "experiment-executions")
sockets = pytest.mark.django_db(transaction=True)


def run_async(scenario: Callable[[], Awaitable[Any]]) -> Any:
    return async_to_sync(scenario)()


@pytest.fixture
def experiment(example_target: Target, close_thread_connections: None) -> Experiment:
    # Candidate "b"*40 against baseline "a"*40: the factory's.
    return ExperimentFactory.create(target=example_target, probes=["latency-bench"])


def headers_for(user: User) -> list[tuple[bytes, bytes]]:
    client = Client()
    client.force_login(user)
    return [(b"origin", b"http://localhost"),
            (b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode())]


async def opened(experiment: Experiment, user: User) -> WebsocketCommunicator:
    headers = await sync_to_async(headers_for)(user)
    communicator = WebsocketCommunicator(application, f"/ws/experiments/{experiment.pk}/",
                                         headers=headers)
    connected, code = await communicator.connect(timeout=TIMEOUT)
    assert connected, code
    return communicator


def refresh_order(frame: str) -> list[str]:
    found = re.search(r'<template data-live-fetch [^>]*data-refresh="([^"]*)"', frame)
    assert found, frame
    return found.group(1).split()


def finish(experiment: Experiment) -> None:
    Experiment.objects.filter(pk=experiment.pk).update(
        status=Experiment.Status.SUCCEEDED, feedback={"verdict": "improved", "findings": []})
    experiment_finished.send(Experiment, experiment_id=experiment.pk)


@sockets
def test_a_finished_experiment_has_the_open_page_re_read_its_parts(
        experiment: Experiment, viewer: User) -> None:
    async def scenario() -> str:
        socket = await opened(experiment, viewer)
        await socket.send_json_to({"after": 0, "state": "queued"})
        assert await socket.receive_nothing(timeout=1)  # nothing moved yet
        await sync_to_async(finish)(experiment)
        frame = await socket.receive_from(timeout=TIMEOUT)
        await socket.disconnect()
        return str(frame)

    frame = run_async(scenario)

    assert refresh_order(frame) == list(REFRESHED)
    assert f'data-url="/experiments/{experiment.pk}/"' in frame


@sockets
def test_a_claim_moves_the_page_too(experiment: Experiment, viewer: User) -> None:
    async def scenario() -> str:
        socket = await opened(experiment, viewer)
        await socket.send_json_to({"after": 0, "state": "queued"})
        assert await socket.receive_nothing(timeout=1)
        claimed = await sync_to_async(experiment_claim)(experiment_id=experiment.pk,
                                                        worker="w1")
        assert claimed is not None and claimed.status == Experiment.Status.RUNNING
        frame = await socket.receive_from(timeout=TIMEOUT)
        await socket.disconnect()
        return str(frame)

    assert "experiment-feedback" in refresh_order(run_async(scenario))


@sockets
def test_a_page_that_missed_the_change_re_reads_when_it_connects(
        experiment: Experiment, viewer: User) -> None:
    finish(experiment)  # before the page's socket exists: that notice reaches no one

    async def scenario() -> tuple[str, bool]:
        stale = await opened(experiment, viewer)
        await stale.send_json_to({"after": 0, "state": "running"})
        frame = await stale.receive_from(timeout=TIMEOUT)
        await stale.disconnect()
        current = await opened(experiment, viewer)
        await current.send_json_to({"after": 0, "state": "succeeded"})
        quiet = await current.receive_nothing(timeout=1)
        await current.disconnect()
        return str(frame), quiet

    frame, quiet = run_async(scenario)

    assert refresh_order(frame) == list(REFRESHED)
    assert quiet  # a page that shows the state the experiment is in has nothing to re-read


@pytest.mark.django_db
def test_the_page_marks_what_it_re_reads_and_loads_the_charts_while_they_may_come(
        client: Client, viewer: User, experiment: Experiment) -> None:
    client.force_login(viewer)
    page = client.get(f"/experiments/{experiment.pk}/").content.decode()
    for part in REFRESHED:
        assert f'id="{part}"' in page
    assert 'data-live-state="queued"' in page
    bundle = static("vendor/plotly/plotly-cartesian.min.js")  # hashed once collected
    assert bundle in page  # feedback and charts arrive when it ends
    finish(experiment)
    done = client.get(f"/experiments/{experiment.pk}/").content.decode()
    assert 'data-live-state="succeeded"' in done and bundle not in done


@pytest.mark.django_db
def test_after_n_the_page_holds_the_rows_after_n(client: Client, viewer: User,
                                                 experiment: Experiment) -> None:
    ExperimentLog.objects.bulk_create(
        ExperimentLog(experiment=experiment, seq=n, stream="stdout", text=f"line {n}")
        for n in range(1, 6))
    client.force_login(viewer)
    page = client.get(f"/experiments/{experiment.pk}/?after=3").content.decode()
    assert re.findall(r'data-seq="(\d+)"', page) == ["4", "5"]
    assert re.findall(r'data-seq="(\d+)"', client.get(
        f"/experiments/{experiment.pk}/?after=x").content.decode()) == ["1", "2", "3", "4", "5"]
