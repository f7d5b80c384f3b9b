"""infraops/experiments/fleet.py: registering workers, their hashed tokens, every refusal
with its status and words, heartbeats, and which refs a worker may push."""

from __future__ import annotations

import hashlib

import pytest
from django.core.management import call_command
from django.db import connection

from agents.models import AgentRun
from infraops.errors import DomainError
from infraops.experiments import fleet
from infraops.experiments.fleet import (
    WorkerRefused,
    worker_authenticate,
    worker_heartbeat,
    worker_may_push,
    worker_register,
    worker_revoke,
)
from infraops.models import AuditEntry, Target, Worker
from infraops.version import VERSION
from tests.factories import AgentRunFactory, UserFactory

pytestmark = [pytest.mark.django_db]


def bearer(token: str) -> str:
    return f"Bearer {token}"


def refusal(authorization: str, version: str = VERSION) -> WorkerRefused:
    with pytest.raises(WorkerRefused) as caught:
        worker_authenticate(authorization, version)
    return caught.value


def test_registering_returns_a_token_that_is_stored_only_as_its_hash() -> None:
    worker, token = worker_register(name="gpu-1", queues=["experiments", "experiments.gpu"],
                                    by=None)

    assert token.startswith(f"iow_{worker.token_prefix}_")
    assert len(worker.token_prefix) == 8
    assert worker.token_hash == hashlib.sha256(token.encode()).hexdigest()
    assert worker.queues == ["experiments", "experiments.gpu"]
    with connection.cursor() as cursor:
        cursor.execute("SELECT row_to_json(w)::text FROM infraops_worker w")
        row = cursor.fetchone()[0]
        cursor.execute("SELECT coalesce(string_agg(data::text, ' '), '') FROM infraops_auditentry")
        audit = cursor.fetchone()[0]
    secret = token[len("iow_") + 8 + 1:]  # the secret may itself hold "_"
    assert token not in row and secret not in row
    assert token not in audit and secret not in audit


def test_a_name_in_use_is_refused_in_words() -> None:
    worker_register(name="gpu-1", queues=["experiments"], by=None)

    with pytest.raises(DomainError, match="a worker named 'gpu-1' exists already"):
        worker_register(name="gpu-1", queues=["experiments"], by=None)


@pytest.mark.parametrize(("queues", "says"), [
    ([], "at least one queue"),
    (["experiments", "bad queue"], "is not a queue name"),
])
def test_bad_queues_are_refused_in_words(queues: list[str], says: str) -> None:
    with pytest.raises(DomainError, match=says):
        worker_register(name="gpu-1", queues=queues, by=None)


def test_the_token_authenticates_its_worker() -> None:
    worker, token = worker_register(name="gpu-1", queues=["experiments"], by=None)

    assert worker_authenticate(bearer(token), VERSION) == worker


@pytest.mark.parametrize(("header", "says"), [
    ("", "no worker token: send Authorization: Bearer <token> (INFRAOPS_WORKER_TOKEN)"),
    ("Basic dXNlcjpwYXNz", "malformed worker token"),
    ("Bearer not-a-token", "malformed worker token"),
    ("Bearer iow_abc_def", "malformed worker token"),
    ("Bearer iow_abcdefgh_" + "A" * 43, "unknown worker token"),
])
def test_a_missing_malformed_or_unknown_token_is_a_401_in_words(header: str, says: str) -> None:
    worker_register(name="gpu-1", queues=["experiments"], by=None)

    refused = refusal(header)

    assert refused.status == 401
    assert says in refused.message


def test_a_token_with_a_known_prefix_but_another_secret_is_unknown() -> None:
    _, token = worker_register(name="gpu-1", queues=["experiments"], by=None)
    forged = token[:-1] + ("A" if token[-1] != "A" else "B")

    refused = refusal(bearer(forged))

    assert (refused.status, "unknown worker token" in refused.message) == (401, True)


def test_a_revoked_worker_is_a_403_naming_it_when_and_by_whom() -> None:
    admin = UserFactory.create(username="ada", is_superuser=True)
    worker, token = worker_register(name="gpu-1", queues=["experiments"], by=admin)
    worker_revoke(worker=worker, by=admin)
    worker.refresh_from_db()

    refused = refusal(bearer(token))

    assert refused.status == 403
    assert "'gpu-1'" in refused.message
    assert f"{worker.revoked_at:%Y-%m-%d %H:%M}" in refused.message
    assert "by ada" in refused.message
    assert "register a new worker" in refused.message


def test_another_release_is_a_409_naming_both_versions() -> None:
    _, token = worker_register(name="gpu-1", queues=["experiments"], by=None)

    refused = refusal(bearer(token), "0.23.0")

    assert refused.status == 409
    assert refused.message == (f"worker version 0.23.0, web version {VERSION}: run the same "
                               "release on both")


def test_no_version_header_is_a_409_too() -> None:
    _, token = worker_register(name="gpu-1", queues=["experiments"], by=None)

    refused = refusal(bearer(token), "")

    assert refused.status == 409
    assert "(none sent)" in refused.message


def test_revoking_is_audited_once_and_twice_changes_nothing() -> None:
    admin = UserFactory.create(username="ada", is_superuser=True)
    worker, _ = worker_register(name="gpu-1", queues=["experiments"], by=admin)

    worker_revoke(worker=worker, by=admin)
    worker_revoke(worker=worker, by=admin)

    entries = AuditEntry.objects.filter(action="worker.revoke", object_id=str(worker.pk))
    assert [(e.actor, e.data["name"]) for e in entries] == [(admin, "gpu-1")]
    worker.refresh_from_db()
    assert worker.revoked_by == admin and worker.revoked_at is not None


GPU = {"kind": "gpu", "model": "NVIDIA H200", "memory_mib": 143771, "driver": "565.57",
       "index": 0}


def test_a_heartbeat_records_what_the_worker_reports() -> None:
    worker, _ = worker_register(name="gpu-1", queues=["experiments"], by=None)

    worker_heartbeat(worker=worker, report={"host": "gpu-host-7", "queues": ["experiments"],
                                            "accelerators": [GPU], "running": "experiment 12",
                                            "pid": 4242})

    worker.refresh_from_db()
    assert (worker.host, worker.pid, worker.running, worker.version) == (
        "gpu-host-7", 4242, "experiment 12", VERSION)
    assert worker.accelerators == [GPU]
    assert worker.last_seen_at is not None
    assert fleet.worker_state(worker) == "live"


@pytest.mark.parametrize(("report", "says"), [
    ([], "must be a JSON object"),
    ({}, "'host'"),
    ({"host": ""}, "'host'"),
    ({"host": 7}, "'host' must be a string"),
    ({"host": "h", "pid": "12"}, "'pid' must be a positive integer"),
    ({"host": "h", "pid": True}, "'pid' must be a positive integer"),
    ({"host": "h", "running": 3}, "'running' must be a string"),
    ({"host": "h", "queues": "experiments"}, "'queues' must be a list"),
    ({"host": "h", "accelerators": {"kind": "gpu"}}, "'accelerators' must be a list"),
    ({"host": "h", "accelerators": ["gpu"]}, "accelerators[0]: must be an object"),
    ({"host": "h", "accelerators": [{"model": "x"}]}, "accelerators[0]: 'kind'"),
    ({"host": "h", "accelerators": [GPU | {"memory_mib": "lots"}]}, "'memory_mib'"),
])
def test_a_bad_heartbeat_is_a_400_in_words(report: object, says: str) -> None:
    worker, _ = worker_register(name="gpu-1", queues=["experiments"], by=None)

    with pytest.raises(WorkerRefused) as caught:
        worker_heartbeat(worker=worker, report=report)

    assert caught.value.status == 400
    assert says in caught.value.message, caught.value.message
    worker.refresh_from_db()
    assert worker.last_seen_at is None


# --- pushes ------------------------------------------------------------------------------------

@pytest.fixture
def live_run(db: None) -> AgentRun:
    return AgentRunFactory.create()


@pytest.fixture
def agent_worker(db: None) -> Worker:
    return worker_register(name="agent-1", queues=["agent", "experiments"], by=None)[0]


def test_an_agent_worker_may_push_the_branches_of_a_running_run(live_run: AgentRun,
                                                                 agent_worker: Worker) -> None:
    target = live_run.target
    assert worker_may_push(agent_worker, f"refs/heads/infraops/run-{live_run.pk}", target) is None
    assert worker_may_push(agent_worker, f"refs/heads/infraops/run-{live_run.pk}-h3",
                           target) is None


@pytest.mark.parametrize(("ref", "says"), [
    ("refs/heads/main", "is not an agent run's branch"),
    ("refs/tags/v1", "is not an agent run's branch"),
    ("refs/merges/1", "is not an agent run's branch"),
    ("refs/heads/infraops/run-{run}x", "is not an agent run's branch"),
    ("refs/heads/infraops/other-{run}", "is not an agent run's branch"),
    ("refs/heads/infraops/run-0", "is not an agent run's branch"),
])
def test_other_refs_are_refused(live_run: AgentRun, agent_worker: Worker, ref: str,
                                says: str) -> None:
    reason = worker_may_push(agent_worker, ref.format(run=live_run.pk), live_run.target)

    assert reason is not None and says in reason


def test_a_run_that_is_not_running_or_not_of_the_target_takes_no_push(
        live_run: AgentRun, agent_worker: Worker) -> None:
    ref = f"refs/heads/infraops/run-{live_run.pk}"
    other = Target.objects.create(name="t2", repo_url="/nowhere")

    assert "not a run of this target" in (worker_may_push(agent_worker, ref, other) or "")
    assert "there is no run" in (worker_may_push(
        agent_worker, f"refs/heads/infraops/run-{live_run.pk + 1000}", live_run.target) or "")
    AgentRun.objects.filter(pk=live_run.pk).update(status=AgentRun.Status.PAUSED)
    assert "is paused, not running" in (worker_may_push(agent_worker, ref, live_run.target) or "")


def test_a_worker_without_the_agent_queue_may_push_nothing(live_run: AgentRun) -> None:
    worker, _ = worker_register(name="gpu-1", queues=["experiments.gpu"], by=None)

    reason = worker_may_push(worker, f"refs/heads/infraops/run-{live_run.pk}", live_run.target)

    assert reason is not None and "does not consume the 'agent' queue" in reason


def test_with_no_check_registered_every_push_is_refused(live_run: AgentRun, agent_worker: Worker,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fleet, "PUSH_CHECKS", [])

    reason = worker_may_push(agent_worker, f"refs/heads/infraops/run-{live_run.pk}",
                             live_run.target)

    assert reason is not None and "no push is allowed" in reason


# --- the commands -----------------------------------------------------------------------------

def test_the_register_command_prints_only_the_token_and_the_revoke_command_revokes(
        capsys: pytest.CaptureFixture[str]) -> None:
    call_command("worker_register", "gpu-1", "--queues", "experiments, experiments.gpu")
    token = capsys.readouterr().out.strip()

    worker = worker_authenticate(bearer(token), VERSION)
    assert worker.queues == ["experiments", "experiments.gpu"]

    call_command("worker_revoke", "gpu-1")
    assert "is revoked" in capsys.readouterr().out
    assert refusal(bearer(token)).status == 403


def test_the_register_command_refuses_a_name_in_use_in_words() -> None:
    from django.core.management.base import CommandError

    call_command("worker_register", "gpu-1")
    with pytest.raises(CommandError, match="exists already"):
        call_command("worker_register", "gpu-1")
    with pytest.raises(CommandError, match="no worker named"):
        call_command("worker_revoke", "gpu-9")
