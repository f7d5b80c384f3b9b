"""/fleet/api/: the heartbeat and the blobs over HTTP, as a worker on another host calls them
(token and release on every request; JSON refusals in words, never a 500)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.test import Client

from infraops.experiments.blobs import blob_path
from infraops.experiments.fleet import worker_register, worker_revoke
from infraops.models import Worker
from infraops.version import VERSION

pytestmark = pytest.mark.django_db

HEARTBEAT = "/fleet/api/heartbeat"
GPU = {"kind": "gpu", "model": "NVIDIA H200", "memory_mib": 143771, "driver": "565.57",
       "index": 0}


@pytest.fixture
def registered(db: None) -> tuple[Worker, str]:
    return worker_register(name="gpu-1", queues=["experiments", "experiments.gpu"], by=None)


@pytest.fixture
def api(registered: tuple[Worker, str]) -> Client:
    """A client that sends what a worker sends, and no cookie: CSRF is checked as a browser's
    would be, so only an exempt view answers a POST or a PUT."""
    return Client(enforce_csrf_checks=True, headers={
        "Authorization": f"Bearer {registered[1]}", "X-InfraOps-Version": VERSION})


def beat(client: Client, body: Any, **kwargs: Any) -> Any:
    return client.post(HEARTBEAT, body, content_type="application/json", **kwargs)


def test_a_heartbeat_answers_the_registered_queues_and_updates_the_row(
        api: Client, registered: tuple[Worker, str]) -> None:
    response = beat(api, {"host": "gpu-host-7", "queues": ["experiments.gpu"],
                          "accelerators": [GPU], "running": "experiment 12", "pid": 4242})

    assert response.status_code == 200, response.content
    assert response.json() == {"worker": "gpu-1", "queues": ["experiments", "experiments.gpu"],
                               "heartbeat_s": 5}
    worker = Worker.objects.get(pk=registered[0].pk)
    assert (worker.host, worker.running, worker.pid, worker.accelerators) == (
        "gpu-host-7", "experiment 12", 4242, [GPU])
    assert worker.last_seen_at is not None


@pytest.mark.parametrize(("body", "says"), [
    ("not json", "not JSON"),
    ("[1, 2]", "must be a JSON object"),
    ('{"host": "h", "pid": -1}', "'pid'"),
    ('{"host": "h", "accelerators": [{"kind": 1}]}', "'kind'"),
])
def test_a_bad_heartbeat_body_is_a_400_in_words(api: Client, body: str, says: str) -> None:
    response = beat(api, body)

    assert response.status_code == 400
    assert says in response.json()["error"]


@pytest.mark.parametrize(("headers", "status", "says"), [
    ({}, 401, "no worker token"),
    ({"Authorization": "Bearer nonsense"}, 401, "malformed worker token"),
    ({"Authorization": "Bearer iow_abcdefgh_" + "x" * 43}, 401, "unknown worker token"),
])
def test_a_request_without_a_good_token_is_refused_in_words(
        registered: tuple[Worker, str], headers: dict[str, str], status: int, says: str) -> None:
    response = beat(Client(headers=headers | {"X-InfraOps-Version": VERSION}), {"host": "h"})

    assert response.status_code == status
    assert says in response.json()["error"]
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_a_revoked_worker_or_another_release_is_refused_on_every_endpoint(
        registered: tuple[Worker, str]) -> None:
    worker, token = registered
    old = Client(headers={"Authorization": f"Bearer {token}", "X-InfraOps-Version": "0.23.0"})
    for response in (beat(old, {"host": "h"}), old.get(f"/fleet/api/blobs/{'0' * 64}"),
                     old.get("/fleet/git/target-1.git/info/refs?service=git-upload-pack")):
        assert response.status_code == 409
        assert response.json()["error"] == (f"worker version 0.23.0, web version {VERSION}: "
                                            "run the same release on both")
    worker_revoke(worker=worker, by=None)
    current = Client(headers={"Authorization": f"Bearer {token}", "X-InfraOps-Version": VERSION})

    response = beat(current, {"host": "h"})

    assert response.status_code == 403
    assert "'gpu-1' was revoked" in response.json()["error"]


def test_a_heartbeat_is_posted_not_read(api: Client) -> None:
    response = api.get(HEARTBEAT)

    assert response.status_code == 405
    assert "use POST" in response.json()["error"]


# --- blobs -------------------------------------------------------------------------------------

def blob_url(sha256: str) -> str:
    return f"/fleet/api/blobs/{sha256}"


def put(client: Client, sha256: str, content: bytes, **headers: str) -> Any:
    return client.put(blob_url(sha256), content, content_type="application/octet-stream",
                      headers=headers)


def test_a_blob_goes_up_once_and_comes_back_whole(api: Client) -> None:
    content = bytes(range(256)) * 1000
    sha = hashlib.sha256(content).hexdigest()

    first, again = put(api, sha, content), put(api, sha, content)
    fetched = api.get(blob_url(sha))

    assert (first.status_code, first.json()) == (201, {"sha256": sha, "size": len(content)})
    assert (again.status_code, again.json()) == (200, {"sha256": sha, "size": len(content)})
    assert fetched.status_code == 200
    assert fetched["Content-Type"] == "application/octet-stream"
    assert fetched["Content-Length"] == str(len(content))
    assert b"".join(fetched.streaming_content) == content
    # The same layout as ever: a single-host reader finds it where it always was.
    assert blob_path(Path(settings.DATA_DIR) / "blobs", sha).read_bytes() == content


def test_content_that_is_not_its_name_is_refused_and_nothing_is_stored(api: Client) -> None:
    named = hashlib.sha256(b"what was meant").hexdigest()

    response = put(api, named, b"what came")

    assert response.status_code == 400
    assert f"is {hashlib.sha256(b'what came').hexdigest()}, not {named}" in response.json()["error"]
    assert api.get(blob_url(named)).status_code == 404
    assert list((Path(settings.DATA_DIR) / "uploads").iterdir()) == []


def test_a_blob_over_the_cap_is_a_413_and_is_not_stored(api: Client, settings: Any) -> None:
    settings.BLOB_MAX_BYTES = 10
    content = b"eleven byte"
    sha = hashlib.sha256(content).hexdigest()

    response = put(api, sha, content)

    assert response.status_code == 413
    assert "INFRAOPS_BLOB_MAX_BYTES" in response.json()["error"]
    assert api.get(blob_url(sha)).status_code == 404
    assert put(api, hashlib.sha256(b"ten bytes!").hexdigest(), b"ten bytes!").status_code == 201


def test_a_body_longer_than_its_content_length_is_a_413(api: Client) -> None:
    content = b"x" * 100
    sha = hashlib.sha256(content).hexdigest()

    response = put(api, sha, content, CONTENT_LENGTH="10")

    assert response.status_code in (400, 413)
    assert api.get(blob_url(sha)).status_code == 404


def test_a_put_without_content_length_is_a_411(api: Client) -> None:
    # Django's test client always computes a length; a blank one is what a chunked request
    # leaves in the WSGI environment.
    response = api.generic("PUT", blob_url("1" * 64), b"", CONTENT_LENGTH="")

    assert response.status_code == 411
    assert "Content-Length" in response.json()["error"]


def test_a_missing_blob_is_a_404_and_a_name_that_is_not_a_sha256_a_400(api: Client) -> None:
    missing = api.get(blob_url("a" * 64))
    bad = api.get(blob_url("not-a-sha"))
    upper = api.put(blob_url("A" * 64), b"x", content_type="application/octet-stream")

    assert (missing.status_code, "no blob" in missing.json()["error"]) == (404, True)
    assert (bad.status_code, "is not a blob name" in bad.json()["error"]) == (400, True)
    assert upper.status_code == 400
