"""Tasks are sent only after their transaction commits (reliability row C5,
docs/reliability.md): of 100 transactions that request an experiment, the 50 that roll back
send nothing, and each of the 50 that commit sends exactly one message whose experiment another
connection already sees when the message leaves, so a worker taking it at once never meets a
missing row. Observed on the real broker: the test's own Redis database."""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery.signals import before_task_publish
from django.conf import settings
from django.db import connections, transaction

from infraops.experiments.services import experiment_request
from infraops.models import Experiment, Target
from tests.infraops.experiments.test_services import candidate_commit

pytestmark = pytest.mark.django_db(transaction=True)

TRANSACTIONS = 100
QUEUE = "experiments"


class RolledBack(Exception):
    pass


@pytest.fixture
def broker() -> Iterator[redis.Redis]:
    """The broker's queue of experiments, empty before and after the test."""
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    client.delete(QUEUE)
    yield client
    client.delete(QUEUE)


def seen_by_another_connection(experiment_id: int) -> bool:
    """Whether a connection other than this thread's (a worker's) finds the row now."""
    found: list[bool] = []

    def look() -> None:
        try:
            found.append(Experiment.objects.filter(pk=experiment_id).exists())
        finally:
            connections.close_all()

    thread = threading.Thread(target=look)
    thread.start()
    thread.join(timeout=60)
    return found == [True]


def queued_experiment_ids(client: redis.Redis) -> list[int]:
    """The experiment id of every message in the broker's queue (kombu's Redis format)."""
    ids = []
    for raw in client.lrange(QUEUE, 0, -1):
        message = json.loads(raw)
        args, _kwargs, _embed = json.loads(base64.b64decode(message["body"]))
        ids.append(int(args[0]))
    return ids


def test_only_committed_experiments_are_sent_and_each_is_visible_when_it_is_sent(
    example_target: Target, data_dir: Path, broker: redis.Redis
) -> None:
    candidate = candidate_commit(example_target, data_dir)
    visible_at_send: dict[int, bool] = {}

    def on_publish(sender: Any = None, body: Any = None, **kwargs: Any) -> None:
        experiment_id = int(body[0][0])
        visible_at_send[experiment_id] = seen_by_another_connection(experiment_id)

    before_task_publish.connect(on_publish, weak=False)
    committed, rolled_back = [], []
    try:
        for number in range(TRANSACTIONS):
            try:
                with transaction.atomic():
                    experiment = experiment_request(
                        target=example_target, candidate_commit=candidate,
                        baseline_commit=example_target.manifest_commit, origin="c5")
                    if number % 2:
                        rolled_back.append(experiment.pk)
                        raise RolledBack
                committed.append(experiment.pk)
            except RolledBack:
                pass
    finally:
        before_task_publish.disconnect(on_publish)

    assert len(committed) == len(rolled_back) == TRANSACTIONS // 2
    sent = queued_experiment_ids(broker)
    assert sorted(sent) == sorted(committed)  # exactly one message each, none for a rollback
    assert visible_at_send == dict.fromkeys(committed, True)
    assert not Experiment.objects.filter(pk__in=rolled_back).exists()
