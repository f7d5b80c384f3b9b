"""/fleet/git/: git's smart HTTP over a target's clone, through the real web application
(uvicorn and infraops.project.asgi in this process) and a real git client authenticating as
a worker does: `git -c http.extraHeader=...`. A worker fetches any commit by its id; it may
push only its live runs' branches, and a refused push changes no ref."""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn

from agents.models import AgentRun
from infraops import gitops
from infraops.experiments.fleet import worker_register
from infraops.models import Goal, Target
from infraops.version import VERSION
from tests.factories import AgentRunFactory

pytestmark = [pytest.mark.django_db(transaction=True),
              pytest.mark.usefixtures("close_thread_connections")]

ZERO = "0" * 40


@pytest.fixture
def web() -> Iterator[str]:
    """The product's ASGI application under uvicorn, on a free port of this host."""
    from infraops.project.asgi import application

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(application, lifespan="off", log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    server.should_exit = True
    thread.join(timeout=60)
    listener.close()


def client_git(repo: Path, *args: str, token: str = "", version: str = VERSION,
               check: bool = True) -> subprocess.CompletedProcess[str]:
    """A worker's git: its token and release on every request, no prompt, no hooks."""
    headers = [f"http.extraHeader=Authorization: Bearer {token}"] if token else []
    headers.append(f"http.extraHeader=X-InfraOps-Version: {version}")
    options = [arg for header in headers for arg in ("-c", header)]
    result = subprocess.run(
        ["git", "-c", "core.hooksPath=/dev/null", "-c", "user.name=w", "-c", "user.email=w@x",
         *options, *args], cwd=repo, capture_output=True, text=True, timeout=120,
        env={"GIT_TERMINAL_PROMPT": "0", "PATH": "/usr/bin:/bin", "HOME": str(repo)})
    if check:
        assert result.returncode == 0, result.stderr
    return result


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    repo = tmp_path / "worker-cache"
    subprocess.run(["git", "init", "-q", str(repo)], check=True, timeout=60)
    return repo


def url(web: str, target: Target) -> str:
    return f"{web}/fleet/git/target-{target.pk}.git"


def loose_commit(target: Target) -> str:
    """A commit on no branch of the clone (as an experiment's candidate may be)."""
    head = gitops.rev_parse(target.clone_path, target.base_branch)
    tree = gitops.git(target.clone_path, "rev-parse", f"{head}^{{tree}}").strip()
    return gitops.git(target.clone_path, "commit-tree", tree, "-p", head, "-m", "loose",
                      ).strip()


def test_a_worker_fetches_a_commit_on_no_branch_by_its_id(
        web: str, example_target: Target, checkout: Path) -> None:
    _, token = worker_register(name="gpu-1", queues=["experiments"], by=None)
    commit = loose_commit(example_target)

    client_git(checkout, "fetch", "--quiet", url(web, example_target), commit, token=token)

    assert client_git(checkout, "cat-file", "-t", commit).stdout.strip() == "commit"


def test_a_fetch_without_a_token_or_of_another_release_fails(
        web: str, example_target: Target, checkout: Path) -> None:
    _, token = worker_register(name="gpu-1", queues=["experiments"], by=None)

    anonymous = client_git(checkout, "fetch", url(web, example_target), "main", check=False)
    old = client_git(checkout, "fetch", url(web, example_target), "main", token=token,
                     version="0.23.0", check=False)

    # A 401 makes git ask for a user name, which a worker's git may not do.
    assert anonymous.returncode != 0
    assert "401" in anonymous.stderr or "could not read Username" in anonymous.stderr
    assert old.returncode != 0 and "409" in old.stderr


@pytest.fixture
def run(example_goal: Goal) -> AgentRun:
    return AgentRunFactory.create(goal=example_goal)


def a_new_commit(web: str, target: Target, checkout: Path, token: str) -> str:
    client_git(checkout, "fetch", "--quiet", url(web, target), "main", token=token)
    client_git(checkout, "checkout", "--quiet", "-B", "work", "FETCH_HEAD")
    (checkout / "agent-note.txt").write_text("a change\n")
    client_git(checkout, "add", "agent-note.txt")
    client_git(checkout, "commit", "--quiet", "-m", "agent step")
    return client_git(checkout, "rev-parse", "HEAD").stdout.strip()


def refs(target: Target) -> str:
    return gitops.git(target.clone_path, "for-each-ref", "--format=%(refname) %(objectname)")


def test_an_agent_worker_pushes_its_runs_branches(web: str, run: AgentRun,
                                                  checkout: Path) -> None:
    target = run.target
    _, token = worker_register(name="agent-1", queues=["agent"], by=None)
    commit = a_new_commit(web, target, checkout, token)

    client_git(checkout, "push", "--quiet", url(web, target),
               f"HEAD:refs/heads/infraops/run-{run.pk}",
               f"HEAD:refs/heads/infraops/run-{run.pk}-h2", token=token)

    assert gitops.rev_parse(target.clone_path, f"infraops/run-{run.pk}") == commit
    assert gitops.rev_parse(target.clone_path, f"infraops/run-{run.pk}-h2") == commit


@pytest.mark.parametrize("refspec", [
    "HEAD:refs/heads/main",
    "HEAD:refs/tags/v9",
    "HEAD:refs/heads/feature/{run}",
    "HEAD:refs/merges/{run}",
    "HEAD:refs/heads/infraops/run-{other}",
])
def test_a_push_to_anything_else_is_refused_and_no_ref_changes(
        web: str, run: AgentRun, checkout: Path, refspec: str) -> None:
    target = run.target
    _, token = worker_register(name="agent-1", queues=["agent"], by=None)
    a_new_commit(web, target, checkout, token)
    before = refs(target)

    # With an allowed ref beside it: the whole push is refused, not just the bad ref.
    result = client_git(checkout, "push", url(web, target),
                        f"HEAD:refs/heads/infraops/run-{run.pk}",
                        refspec.format(run=run.pk, other=run.pk + 1000), token=token,
                        check=False)

    assert result.returncode != 0
    assert "403" in result.stderr
    assert refs(target) == before


def test_a_deletion_is_refused(web: str, run: AgentRun, checkout: Path) -> None:
    target = run.target
    _, token = worker_register(name="agent-1", queues=["agent"], by=None)
    a_new_commit(web, target, checkout, token)
    client_git(checkout, "push", "--quiet", url(web, target),
               f"HEAD:refs/heads/infraops/run-{run.pk}", token=token)
    before = refs(target)

    result = client_git(checkout, "push", url(web, target),
                        f":refs/heads/infraops/run-{run.pk}", token=token, check=False)

    assert result.returncode != 0
    assert refs(target) == before


def test_a_worker_without_the_agent_queue_cannot_push(web: str, run: AgentRun,
                                                      checkout: Path) -> None:
    target = run.target
    _, token = worker_register(name="gpu-1", queues=["experiments", "experiments.gpu"], by=None)
    a_new_commit(web, target, checkout, token)
    before = refs(target)

    result = client_git(checkout, "push", url(web, target),
                        f"HEAD:refs/heads/infraops/run-{run.pk}", token=token, check=False)

    assert result.returncode != 0
    assert refs(target) == before


def test_a_git_address_that_is_not_served_is_refused_in_words(
        web: str, example_target: Target) -> None:
    from django.test import Client

    _, token = worker_register(name="gpu-1", queues=["experiments"], by=None)
    client = Client(headers={"Authorization": f"Bearer {token}", "X-InfraOps-Version": VERSION})
    base = f"/fleet/git/target-{example_target.pk}.git"

    dumb = client.get(f"{base}/info/refs")
    other = client.get(f"{base}/info/refs?service=git-upload-archive")
    objects = client.get(f"{base}/objects/info/packs")
    missing = client.get(f"/fleet/git/target-{example_target.pk + 1000}.git/info/refs"
                         "?service=git-upload-pack")
    garbage = client.post(f"{base}/git-receive-pack", b"not pkt-lines",
                          content_type="application/x-git-receive-pack-request")

    assert (dumb.status_code, "smart HTTP" in dumb.json()["error"]) == (400, True)
    assert other.status_code == 400
    assert (objects.status_code, "not a git address" in objects.json()["error"]) == (404, True)
    assert (missing.status_code, "no target" in missing.json()["error"]) == (404, True)
    assert (garbage.status_code, "ref update" in garbage.json()["error"]) == (400, True)


def pkt(line: str) -> bytes:
    return f"{len(line) + 5:04x}{line}\n".encode()


def test_a_gzipped_upload_pack_request_is_served(example_target: Target) -> None:
    """git gzips big upload-pack requests (Content-Encoding: gzip): the same answer."""
    import gzip

    from django.test import Client

    _, token = worker_register(name="gpu-1", queues=["experiments"], by=None)
    commit = loose_commit(example_target)
    request = pkt(f"want {commit}") + b"0000" + pkt("done")
    client = Client(headers={"Authorization": f"Bearer {token}", "X-InfraOps-Version": VERSION})

    response = client.post(f"/fleet/git/target-{example_target.pk}.git/git-upload-pack",
                           gzip.compress(request),
                           content_type="application/x-git-upload-pack-request",
                           headers={"Content-Encoding": "gzip"})
    broken = client.post(f"/fleet/git/target-{example_target.pk}.git/git-upload-pack",
                         b"not gzip", content_type="application/x-git-upload-pack-request",
                         headers={"Content-Encoding": "gzip"})

    assert response.status_code == 200
    assert response["Content-Type"] == "application/x-git-upload-pack-result"
    body = b"".join(response.streaming_content)
    assert body.startswith(b"0008NAK\n") and b"PACK" in body
    assert (broken.status_code, "gzip" in broken.json()["error"]) == (400, True)


def test_blobs_travel_through_the_web_process_too(web: str) -> None:
    """The blob endpoints under uvicorn, as a worker reaches them: up with Content-Length,
    down streamed whole; a chunked upload (no Content-Length) is a 411."""
    import hashlib
    import http.client
    import json
    from urllib.parse import urlsplit

    _, token = worker_register(name="gpu-1", queues=["experiments"], by=None)
    headers = {"Authorization": f"Bearer {token}", "X-InfraOps-Version": VERSION}
    content = bytes(range(256)) * 4096
    sha = hashlib.sha256(content).hexdigest()
    where = urlsplit(web)

    def call(method: str, body: bytes | None = None, chunked: bool = False,
             ) -> tuple[int, bytes]:
        connection = http.client.HTTPConnection(where.hostname or "", where.port, timeout=60)
        connection.request(method, f"/fleet/api/blobs/{sha}",
                           body=iter([body]) if chunked and body else body,
                           headers=headers, encode_chunked=chunked)
        response = connection.getresponse()
        answer = (response.status, response.read())
        connection.close()
        return answer

    chunked = call("PUT", content, chunked=True)
    stored = call("PUT", content)
    fetched = call("GET")

    assert chunked[0] == 411 and b"Content-Length" in chunked[1]
    assert (stored[0], json.loads(stored[1])) == (201, {"sha256": sha, "size": len(content)})
    assert fetched == (200, content)
