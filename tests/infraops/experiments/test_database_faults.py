"""Experiments survive dropped database connections (issue 28, item 1; docs/reliability.md
C8): the worker's backends are terminated again and again while an experiment writes its
log, executions and samples; it ends succeeded at attempt 1, with no row lost or doubled."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from django.db import connection
from django.db.models import Count

from infraops.experiments.services import experiment_execute
from infraops.models import Experiment, ExperimentLog, ProbeExecution, Target
from tests.dbfaults import cutting, dsn
from tests.factories import ExperimentFactory
from tests.infraops.experiments.test_services import candidate_commit

TERMINATIONS = 6


class _Terminator(threading.Thread):
    """From a connection of its own: once the experiment is claimed (running),
    terminate every other backend of the test database, TERMINATIONS times, 0.1 s apart."""

    def __init__(self, dsn: str, experiment_id: int) -> None:
        super().__init__(daemon=True)
        self.dsn, self.experiment_id = dsn, experiment_id
        self.stop, self.done = threading.Event(), 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._terminate()
        except BaseException as exc:
            self.error = exc
            raise

    def _terminate(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as own:
            while not self.stop.wait(0.01):
                started = own.execute("SELECT count(*) FROM infraops_experiment WHERE id = %s "
                                      "AND status = 'running'", (self.experiment_id,)).fetchone()
                if started and started[0]:
                    break
            while self.done < TERMINATIONS and not self.stop.wait(0.1):
                own.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
                            "datname = current_database() AND pid <> pg_backend_pid()")
                self.done += 1


@pytest.fixture
def terminator() -> Iterator[list[_Terminator]]:
    made: list[_Terminator] = []
    yield made
    for thread in made:
        thread.stop.set()
        thread.join(timeout=60)


@pytest.mark.django_db(transaction=True)
def test_an_experiment_survives_its_connections_being_terminated_again_and_again(
    example_target: Target, data_dir: Path, terminator: list[_Terminator],
    caplog: pytest.LogCaptureFixture,
) -> None:
    experiment = ExperimentFactory.create(
        target=example_target, candidate_commit=candidate_commit(example_target, data_dir),
        baseline_commit=example_target.manifest_commit, probes=["latency-bench"],
        manifest_sha256=example_target.manifest_sha256)
    thread = _Terminator(dsn(), experiment.pk)
    terminator.append(thread)
    thread.start()

    experiment_execute(experiment_id=experiment.pk, worker="faults:1")
    thread.stop.set()
    thread.join(timeout=60)
    connection.close()  # the test's own connection was terminated too

    experiment.refresh_from_db()
    assert thread.error is None
    assert thread.done >= 1, "the experiment ended before a backend was terminated"
    assert experiment.status == Experiment.Status.SUCCEEDED, experiment.failure_reason
    assert experiment.attempts == 1
    retries = [r for r in caplog.records if r.name == "infraops.dbretry"]
    assert retries, "no write met a terminated connection: nothing was shown"
    keys = ProbeExecution.objects.filter(experiment=experiment).values(
        "attempt", "probe", "side", "variant", "repeat_index").annotate(n=Count("id"))
    assert keys and all(row["n"] == 1 for row in keys)
    seqs = ExperimentLog.objects.filter(experiment=experiment).values("seq").annotate(
        n=Count("id"))
    assert all(row["n"] == 1 for row in seqs)


@pytest.mark.django_db(transaction=True)
def test_a_connection_dropped_while_the_attempt_is_analysed_is_read_again_not_lost(
    example_target: Target, data_dir: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The analysis reads the attempt's executions and labels after the probes ran: a backend
    terminated there made the attempt "failed unexpectedly", lost to the database, and a tuner
    run then paused with a configuration it could not judge (seen in a whole-suite run)."""
    from infraops.experiments import analysis

    label_sizes, cuts = cutting(analysis._label_sizes, 1)
    monkeypatch.setattr(analysis, "_label_sizes", label_sizes)
    experiment = ExperimentFactory.create(
        target=example_target, candidate_commit=candidate_commit(example_target, data_dir),
        baseline_commit=example_target.manifest_commit, probes=["latency-bench"],
        manifest_sha256=example_target.manifest_sha256)

    experiment_execute(experiment_id=experiment.pk, worker="faults:1")
    connection.close()

    experiment.refresh_from_db()
    assert cuts == [1]
    assert experiment.status == Experiment.Status.SUCCEEDED, experiment.failure_reason
    assert (experiment.attempts, experiment.lost) == (1, False)
    assert any(r.name == "infraops.dbretry" and "analysis" in r.getMessage()
               for r in caplog.records)
