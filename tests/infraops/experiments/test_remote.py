"""The worker side of a worker on another host (infraops.experiments.remote), against a
stand-in web that speaks the fleet's HTTP contract and can fail the ways a network does."""

from __future__ import annotations

import hashlib
import http.server
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from infraops import gitops
from infraops.experiments import remote
from infraops.version import VERSION

TOKEN = "iow_abcdefgh_secret"


class StandIn(http.server.ThreadingHTTPServer):
    """The web's fleet API, as much of it as the client uses, with faults on demand."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.blobs: dict[str, bytes] = {}
        self.heartbeats: list[dict[str, Any]] = []
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.failures: list[str] = []  # "503", "cut" or "refuse-403", taken one per request
        self.corrupt_next_download = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(http.server.BaseHTTPRequestHandler):
    server: StandIn

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _answer(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, data: dict[str, Any]) -> None:
        self._answer(status, json.dumps(data).encode())

    def _fault(self) -> bool:
        self.server.requests.append((self.command, self.path, dict(self.headers)))
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            self._json(401, {"error": "unknown worker token"})
            return True
        if self.headers.get("X-InfraOps-Version") != VERSION:
            self._json(409, {"error": "another release"})
            return True
        if not self.server.failures:
            return False
        failure = self.server.failures.pop(0)
        if failure == "503":
            self._json(503, {"error": "restarting"})
        elif failure == "cut":
            self.connection.shutdown(2)  # no answer at all
        elif failure == "refuse-403":
            self._json(403, {"error": "worker 'w1' was revoked"})
        return True

    def do_POST(self) -> None:
        if self._fault():
            return
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.heartbeats.append(json.loads(body))
        self._json(200, {"worker": "w1", "queues": ["experiments"], "heartbeat_s": 5})

    def do_GET(self) -> None:
        if self._fault():
            return
        sha = self.path.rsplit("/", 1)[-1]
        if sha not in self.server.blobs:
            self._json(404, {"error": f"no blob {sha}"})
            return
        data = self.server.blobs[sha]
        if self.server.corrupt_next_download:
            self.server.corrupt_next_download = False
            data = data[: len(data) // 2]
        self._answer(200, data, "application/octet-stream")

    def do_PUT(self) -> None:
        if self._fault():
            return
        data = self.rfile.read(int(self.headers["Content-Length"]))
        sha = self.path.rsplit("/", 1)[-1]
        if hashlib.sha256(data).hexdigest() != sha:
            self._json(400, {"error": "the content's sha256 differs"})
            return
        self.server.blobs[sha] = data
        self._json(201, {"sha256": sha, "size": len(data)})


@pytest.fixture
def web() -> Iterator[StandIn]:
    server = StandIn()
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def client_of(web: StandIn, *, token: str = TOKEN, retry_seconds: float = 30) -> remote.WebClient:
    return remote.WebClient(web.url, token, timeout=10, retry_seconds=retry_seconds,
                            sleep=lambda _: None)


def test_every_request_names_the_worker_and_its_release(web: StandIn) -> None:
    answer = client_of(web).heartbeat({"host": "gpu-7", "queues": ["experiments"]})
    assert answer["worker"] == "w1"
    method, path, headers = web.requests[0]
    assert (method, path) == ("POST", "/fleet/api/heartbeat")
    assert headers["Authorization"] == f"Bearer {TOKEN}"
    assert headers["X-InfraOps-Version"] == VERSION
    assert web.heartbeats == [{"host": "gpu-7", "queues": ["experiments"]}]


def test_a_refusal_of_the_worker_is_not_retried_and_keeps_the_webs_words(web: StandIn) -> None:
    with pytest.raises(remote.WorkerNotAccepted, match="unknown worker token") as caught:
        client_of(web, token="iow_wrong_token").heartbeat({})
    assert caught.value.status == 401
    web.failures = ["refuse-403"]
    with pytest.raises(remote.WorkerNotAccepted, match="revoked"):
        client_of(web).heartbeat({})
    assert len(web.requests) == 2  # one request each: no retry


@pytest.mark.parametrize("failure", ["503", "cut"])
def test_a_web_that_restarts_or_a_cut_connection_is_retried(web: StandIn, failure: str) -> None:
    web.failures = [failure, failure]
    assert client_of(web).heartbeat({"host": "h"})["worker"] == "w1"
    assert len(web.requests) == 3
    assert web.heartbeats == [{"host": "h"}]  # recorded once


def test_a_web_gone_for_longer_than_the_window_is_said_in_words(web: StandIn) -> None:
    web.failures = ["503"] * 1000
    with pytest.raises(remote.WebUnreachable, match="did not answer for 0 s"):
        client_of(web, retry_seconds=0).heartbeat({})


def test_blobs_go_up_once_and_come_down_checked(web: StandIn, tmp_path: Path) -> None:
    source = tmp_path / "out.npy"
    source.write_bytes(b"x" * 100_000)
    store = remote.RemoteBlobStore(client_of(web), root=tmp_path / "cache-a")
    sha, size = store.put(source)
    assert (sha, size) == (hashlib.sha256(source.read_bytes()).hexdigest(), 100_000)
    assert web.blobs[sha] == source.read_bytes()

    # Another host reads it: downloaded once into its cache, then local.
    other = remote.RemoteBlobStore(client_of(web), root=tmp_path / "cache-b")
    with other.open(sha) as handle:
        assert handle.read() == source.read_bytes()
    gets = sum(1 for method, _, _ in web.requests if method == "GET")
    assert other.exists(sha)
    assert sum(1 for method, _, _ in web.requests if method == "GET") == gets
    assert not other.exists("0" * 64)


def test_a_download_cut_short_never_lands_as_a_blob(web: StandIn, tmp_path: Path) -> None:
    data = b"reference output " * 1000
    sha = hashlib.sha256(data).hexdigest()
    web.blobs[sha] = data
    web.corrupt_next_download = True
    store = remote.RemoteBlobStore(client_of(web), root=tmp_path / "cache")
    assert store.local_path(sha).read_bytes() == data  # the second try is whole
    assert sorted(p.name for p in (tmp_path / "cache" / sha[:2]).iterdir()) == [sha]


def test_the_cache_fetches_only_what_it_lacks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               settings: Any) -> None:
    origin = tmp_path / "origin.git"
    source = tmp_path / "src"
    source.mkdir()
    (source / "a.py").write_text("x = 1\n")
    first = gitops.repo_init_from_dir(source, origin, branch="main", message="first")
    settings.DATA_DIR = tmp_path / "worker-data"
    settings.WEB_URL, settings.WORKER_TOKEN = "http://127.0.0.1:9", TOKEN
    monkeypatch.setattr(remote.WebClient, "git_url", lambda self, target_id: str(origin))

    cold = remote.target_cache(7, [first])
    assert cold.fetched == [first]
    assert cold.repo == tmp_path / "worker-data" / "cache" / "target-7.git"
    assert gitops.read_file(cold.repo, first, "a.py") == b"x = 1\n"
    warm = remote.target_cache(7, [first])
    assert warm.fetched == []


def test_gpus_are_read_from_nvidia_smi_as_this_worker_sees_them() -> None:
    csv = "0, NVIDIA H200, 143771, 570.86.15\n1, NVIDIA H200, 143771, 570.86.15\n"
    assert remote.parse_gpus(csv, "1") == [
        {"kind": "gpu", "model": "NVIDIA H200", "memory_mib": 143771, "driver": "570.86.15",
         "index": 1}]
    assert len(remote.parse_gpus(csv, None)) == 2
    assert remote.parse_gpus("garbage\n", None) == []
    assert remote.model_queue_name("NVIDIA H200") == "h200"
    assert remote.model_queue_name("NVIDIA A100-SXM4-80GB") == "a100"
    assert remote.model_queue_name("Tesla V100-PCIE-16GB") == "v100"


def test_a_web_url_that_is_not_http_is_refused_in_words() -> None:
    with pytest.raises(remote.DomainError, match="is not an http"):
        remote.WebClient("ftp://example.com", TOKEN)
    with pytest.raises(remote.DomainError, match="INFRAOPS_WORKER_TOKEN is empty"):
        remote.WebClient("http://example.com", "")


def test_the_heartbeat_says_what_each_pool_process_runs(settings: Any, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    settings.DATA_DIR = tmp_path
    monkeypatch.setenv("INFRAOPS_WORKER_NAME", "gpu0@node7")
    assert remote.running_now() == ""
    remote.running_set("experiment 12")
    assert remote.running_now() == "experiment 12"
    # A pool process that died mid-experiment is not reported.
    folder = tmp_path / "running" / "gpu0@node7"
    (folder / "999999999").write_text("experiment 3")
    assert remote.running_now() == "experiment 12"
    assert not (folder / "999999999").exists()
    remote.running_set("")
    assert remote.running_now() == ""


def test_a_web_that_comes_back_within_the_window_is_waited_for() -> None:
    # Nothing listens on the port yet (the web restarting); it answers a second later.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    later = threading.Timer(1.0, lambda: _serve_on(port))
    later.start()
    client = remote.WebClient(f"http://127.0.0.1:{port}", TOKEN, timeout=5, retry_seconds=60)
    try:
        assert client.heartbeat({"host": "h"})["worker"] == "w1"
    finally:
        later.join()
        for server in _SERVED:
            server.shutdown()
            server.server_close()


_SERVED: list[StandIn] = []


def _serve_on(port: int) -> None:
    server = StandIn.__new__(StandIn)
    http.server.ThreadingHTTPServer.__init__(server, ("127.0.0.1", port), Handler)
    server.blobs, server.heartbeats, server.requests, server.failures = {}, [], [], []
    server.corrupt_next_download = False
    _SERVED.append(server)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()


def test_a_revoked_worker_stops_taking_tasks(web: StandIn) -> None:
    web.failures = ["refuse-403"]
    stopped: list[str] = []
    beat = remote.RemoteHeartbeat(["experiments"], on_refused=stopped.append,
                                  web=client_of(web))
    beat.tick()
    beat.tick()  # refused once: not asked again, not stopped twice
    assert len(stopped) == 1 and "revoked" in stopped[0]
    assert len(web.requests) == 1


@pytest.mark.django_db(transaction=True)
def test_a_worker_the_web_refuses_gives_its_experiment_back_to_the_queue(
    web: StandIn, settings: Any, data_dir: Path, example_target: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from infraops.experiments import services
    from infraops.models import Experiment

    settings.WEB_URL, settings.WORKER_TOKEN = web.url, TOKEN
    monkeypatch.setattr(remote, "_client", None)
    sent: list[tuple[int, str]] = []
    monkeypatch.setattr(services, "_send_after_commit",
                        lambda pk, queue: sent.append((pk, queue)))
    stops: list[bool] = []
    monkeypatch.setattr(services, "_stop_this_worker", lambda: stops.append(True))
    commit = example_target.manifest_commit
    experiment = Experiment.objects.create(
        target=example_target, baseline_commit=commit, candidate_commit=commit,
        probes=["latency-bench"], manifest_sha256=example_target.manifest_sha256)
    web.failures = ["refuse-403"] * 10  # the git fetch is refused: the token was revoked

    assert services.experiment_execute(experiment_id=experiment.pk, worker="gpu-7:1") is None
    experiment.refresh_from_db()
    assert experiment.status == Experiment.Status.QUEUED
    assert experiment.claimed_by == "" and experiment.attempts == 1
    assert sent == [(experiment.pk, experiment.queue)] and stops == [True]
