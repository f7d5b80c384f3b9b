"""A worker on another host: what it needs of the web, over HTTP(S) only.

A remote worker (INFRAOPS_WEB_URL and INFRAOPS_WORKER_TOKEN set) shares PostgreSQL and Redis
with the web, and nothing else: no data folder. It keeps its own, holding

- a cache of each target's repository (``<data>/cache/target-N.git``), to which it fetches the
  commits an experiment needs from the web's git endpoint; a second experiment on the same
  target fetches only what is new, and one whose commits are all there fetches nothing;
- a cache of blobs (``<data>/blob-cache``): what it measures is uploaded to the web's store,
  what it reads (a baseline's outputs measured on another host) is downloaded once.

Every request names the worker by its token and its release by ``X-InfraOps-Version``; the web
refuses a revoked token or another release in words (infraops.experiments.fleet), and this
module raises those words as :class:`WebRefused`, never retried. A network failure or a web
that restarts is retried for ``INFRAOPS_WEB_RETRY_SECONDS``; a download lands under its final
name only once its hash is checked, so a cut never leaves half a result.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import os
import shutil
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, BinaryIO, TypeVar

from django.conf import settings

from infraops import errors, gitops
from infraops.errors import DomainError
from infraops.experiments.blobs import CHUNK, blob_path, blob_put
from infraops.experiments.blobstore import BlobMissing, file_sha256
from infraops.experiments.workers import Periodic
from infraops.version import VERSION

log = logging.getLogger(__name__)

T = TypeVar("T")
RETRYABLE_STATUS = frozenset({502, 503, 504})


class WebRefused(DomainError):
    """The web said no (a bad request, a missing blob): its words."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class WorkerNotAccepted(WebRefused, errors.WorkerNotAccepted):
    """The web refuses this worker itself: unknown or revoked token, another release."""


def _refused(message: str, status: int) -> WebRefused:
    if status in (401, 403, 409):
        return WorkerNotAccepted(message, status)
    return WebRefused(message, status)


class WebUnreachable(DomainError):
    """The web did not answer within the retry window."""


class _Transient(Exception):
    """A failure worth another try (connection refused or cut, a timeout, a 502/503/504)."""


@dataclass
class WebClient:
    """Requests of one worker to the web: its token, its release, retries on network faults."""

    base_url: str
    token: str
    timeout: float = 60.0
    retry_seconds: float = 120.0
    sleep: Callable[[float], None] = time.sleep
    _parts: urllib.parse.SplitResult = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._parts = urllib.parse.urlsplit(self.base_url.rstrip("/"))
        if self._parts.scheme not in ("http", "https") or not self._parts.hostname:
            raise DomainError(f"INFRAOPS_WEB_URL={self.base_url!r} is not an http(s) URL "
                              "of the web, e.g. https://infraops.example.com")
        if not self.token:
            raise DomainError("INFRAOPS_WORKER_TOKEN is empty: an admin registers this worker "
                              "(manage.py worker_register NAME) and gives it the token once.")

    # --- plumbing ------------------------------------------------------------------------

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}", "X-InfraOps-Version": VERSION}

    def url(self, path: str) -> str:
        return f"{self.base_url.rstrip('/')}{path}"

    def _connection(self) -> http.client.HTTPConnection:
        host, port = self._parts.hostname or "", self._parts.port
        if self._parts.scheme == "https":
            context = ssl.create_default_context(cafile=os.environ.get("INFRAOPS_WEB_CA") or None)
            return http.client.HTTPSConnection(host, port, timeout=self.timeout, context=context)
        return http.client.HTTPConnection(host, port, timeout=self.timeout)

    def _retrying(self, what: str, attempt: Callable[[], T]) -> T:
        """`attempt()` until it succeeds, is refused, or the retry window closes."""
        deadline = time.monotonic() + self.retry_seconds
        pause = 0.5
        while True:
            try:
                return attempt()
            except _Transient as exc:
                if time.monotonic() + pause > deadline:
                    raise WebUnreachable(
                        f"{what}: the web at {self.base_url} did not answer for "
                        f"{self.retry_seconds:.0f} s ({exc})") from None
                log.warning("%s: %s; trying again in %.1f s", what, exc, pause)
                self.sleep(pause)
                pause = min(pause * 2, 10.0)

    def _exchange(self, method: str, path: str, *, body: bytes | IO[bytes] | None = None,
                  length: int | None = None, content_type: str = "application/json",
                  sink: IO[bytes] | None = None) -> tuple[int, bytes]:
        """One request; the answer's body goes to `sink` (streamed) on a 2xx when given."""
        headers = self.headers()
        if body is not None:
            headers["Content-Type"] = content_type
            headers["Content-Length"] = str(len(body) if isinstance(body, bytes) else length)
        base_path = self._parts.path
        connection = self._connection()
        try:
            connection.request(method, f"{base_path}{path}", body=body, headers=headers)
            response = connection.getresponse()
            if response.status in RETRYABLE_STATUS:
                raise _Transient(f"HTTP {response.status}")
            if sink is not None and 200 <= response.status < 300:
                while chunk := response.read(CHUNK):
                    sink.write(chunk)
                return response.status, b""
            return response.status, response.read()
        except (OSError, http.client.HTTPException) as exc:
            raise _Transient(f"{type(exc).__name__}: {exc}") from exc
        finally:
            connection.close()

    @staticmethod
    def _refusal(status: int, content: bytes) -> WebRefused:
        try:
            message = str(json.loads(content)["error"])
        except (ValueError, KeyError, TypeError):
            message = content[:300].decode("utf-8", "replace").strip() or "(no reason given)"
        return _refused(f"the web refused (HTTP {status}): {message}", status)

    # --- the calls ---------------------------------------------------------------------------

    def post_json(self, path: str, data: dict[str, Any]) -> dict[str, Any]:
        payload = json.dumps(data).encode()

        def attempt() -> dict[str, Any]:
            status, content = self._exchange("POST", path, body=payload)
            if not 200 <= status < 300:
                raise self._refusal(status, content)
            answer = json.loads(content or b"{}")
            return answer if isinstance(answer, dict) else {}

        return self._retrying(f"POST {path}", attempt)

    def heartbeat(self, report: dict[str, Any]) -> dict[str, Any]:
        return self.post_json("/fleet/api/heartbeat", report)

    def blob_download(self, sha256: str, dest: Path) -> None:
        """The blob `sha256` at `dest`, checked against its hash; nothing at `dest` on failure."""
        dest.parent.mkdir(parents=True, exist_ok=True)

        def attempt() -> None:
            with tempfile.NamedTemporaryFile(dir=dest.parent, delete=False) as tmp:
                try:
                    status, content = self._exchange("GET", f"/fleet/api/blobs/{sha256}",
                                                     sink=tmp)
                    if not 200 <= status < 300:
                        raise self._refusal(status, content)
                    tmp.flush()
                    got = file_sha256(Path(tmp.name))
                    if got != sha256:
                        raise _Transient(f"blob {sha256[:12]} arrived as {got[:12]} (cut?)")
                    Path(tmp.name).replace(dest)
                finally:
                    Path(tmp.name).unlink(missing_ok=True)

        self._retrying(f"download of blob {sha256[:12]}", attempt)

    def blob_upload(self, sha256: str, source: Path) -> None:
        size = source.stat().st_size

        def attempt() -> None:
            with source.open("rb") as handle:
                status, content = self._exchange("PUT", f"/fleet/api/blobs/{sha256}", body=handle,
                                                 length=size,
                                                 content_type="application/octet-stream")
            if not 200 <= status < 300:
                raise self._refusal(status, content)

        self._retrying(f"upload of blob {sha256[:12]}", attempt)

    def git_url(self, target_id: int) -> str:
        return self.url(f"/fleet/git/target-{target_id}.git")

    def git(self, what: str, call: Callable[[], None]) -> None:
        """A git call over HTTP, retried like any request when the network fails; a refusal
        (401/403/409) is not retried."""

        def attempt() -> None:
            try:
                call()
            except gitops.GitError as exc:
                text = str(exc)
                for status in (400, 401, 403, 404, 409):
                    if f"error: {status}" in text or f"returned error: {status}" in text:
                        raise _refused(f"the web refused {what} (HTTP {status}): {text}",
                                       status) from None
                raise _Transient(text) from exc

        self._retrying(what, attempt)


def is_remote() -> bool:
    """Whether this process is a worker on another host than the web."""
    return bool(settings.WEB_URL)


_client: WebClient | None = None
_client_lock = threading.Lock()


def client() -> WebClient:
    global _client
    with _client_lock:
        if _client is None or (_client.base_url, _client.token) != (settings.WEB_URL,
                                                                   settings.WORKER_TOKEN):
            _client = WebClient(settings.WEB_URL, settings.WORKER_TOKEN,
                                retry_seconds=settings.WEB_RETRY_SECONDS)
        return _client


# --- the repository cache ------------------------------------------------------------------

def cache_path(target_id: int) -> Path:
    return Path(settings.DATA_DIR) / "cache" / f"target-{target_id}.git"


@contextlib.contextmanager
def _cache_lock(repo: Path) -> Iterator[None]:
    """One fetch at a time into one cache (worker processes of a host share it)."""
    import fcntl

    repo.parent.mkdir(parents=True, exist_ok=True)
    with (repo.parent / f".{repo.name}.lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@dataclass
class CacheFetch:
    """What making the commits of an experiment local cost: the commits fetched (none when
    the cache held them all) and the seconds it took."""

    repo: Path
    fetched: list[str]
    seconds: float


def target_cache(target_id: int, commits: Sequence[str]) -> CacheFetch:
    """This host's cache of target `target_id`'s repository, holding `commits`."""
    web = client()
    repo = cache_path(target_id)
    started = time.monotonic()
    with _cache_lock(repo):
        gitops.repo_init_bare(repo)
        missing = gitops.missing_commits(repo, commits)
        if missing:
            web.git(f"git fetch of target {target_id}",
                    lambda: gitops.fetch_commits(repo, web.git_url(target_id), missing,
                                                 headers=web.headers()))
    return CacheFetch(repo, missing, time.monotonic() - started)


def push_branch(target_id: int, repo: Path, ref: str, commit: str) -> None:
    """Set `ref` (a run's branch) to `commit` on the web's repository of the target."""
    web = client()
    web.git(f"git push of {ref}",
            lambda: gitops.push_refs(repo, web.git_url(target_id), {ref: commit},
                                     headers=web.headers()))


# --- blobs -----------------------------------------------------------------------------------

class RemoteBlobStore:
    """The web's blob store seen from a worker on another host, through a local cache."""

    def __init__(self, web: WebClient | None = None, root: Path | None = None) -> None:
        self.web = web or client()
        self.root = root or Path(settings.DATA_DIR) / "blob-cache"

    def put(self, source: Path) -> tuple[str, int]:
        sha256, size = blob_put(self.root, source)
        self.web.blob_upload(sha256, blob_path(self.root, sha256))
        return sha256, size

    def local_path(self, sha256: str) -> Path:
        path = blob_path(self.root, sha256)
        if not path.is_file():
            try:
                self.web.blob_download(sha256, path)
            except WebRefused as exc:
                if exc.status == 404:
                    raise BlobMissing(f"the web has no blob {sha256}") from None
                raise
        return path

    def exists(self, sha256: str) -> bool:
        try:
            self.local_path(sha256)
        except BlobMissing:
            return False
        return True

    def open(self, sha256: str) -> BinaryIO:
        return self.local_path(sha256).open("rb")


# --- what the worker tells the web ---------------------------------------------------------

def accelerators() -> list[dict[str, Any]]:
    """The GPUs this worker may use (CUDA_VISIBLE_DEVICES respected), from nvidia-smi; none
    when it is missing or fails."""
    nvidia_smi = shutil.which("nvidia-smi")
    if nvidia_smi is None:
        return []
    query = "index,name,memory.total,driver_version"
    try:
        out = subprocess.run(  # nosec B603 (a fixed program and arguments)
            [nvidia_smi, f"--query-gpu={query}", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        log.warning("nvidia-smi failed: this worker reports no GPU", exc_info=True)
        return []
    return parse_gpus(out, os.environ.get("CUDA_VISIBLE_DEVICES"))


def parse_gpus(csv: str, visible: str | None) -> list[dict[str, Any]]:
    """nvidia-smi's CSV as accelerator reports, only the GPUs `visible` names (all when None)."""
    shown = None if visible is None else {v.strip() for v in visible.split(",") if v.strip()}
    gpus = []
    for line in csv.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 4 or not fields[0].isdigit():
            continue
        if shown is not None and fields[0] not in shown:
            continue
        memory = int(fields[2]) if fields[2].isdigit() else 0
        gpus.append({"kind": "gpu", "model": fields[1], "memory_mib": memory,
                     "driver": fields[3], "index": int(fields[0])})
    return gpus


def model_queue_name(model: str) -> str:
    """The queue word of a GPU model: "NVIDIA H200" -> "h200", "NVIDIA A100-SXM4-80GB" -> "a100"."""
    words = [w for w in model.lower().replace("-", " ").split() if w not in ("nvidia", "tesla")]
    return "".join(ch for ch in (words[0] if words else "") if ch.isalnum())


# What this worker's pool processes run now, for its heartbeat: each writes its own file.
def _running_folder() -> Path:
    return Path(settings.DATA_DIR) / "running" / (os.environ.get("INFRAOPS_WORKER_NAME", "")
                                                  or "worker")


def running_set(what: str) -> None:
    """Record what this process runs ("" when idle)."""
    folder = _running_folder()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / str(os.getpid())
    if what:
        path.write_text(what[:200])
    else:
        path.unlink(missing_ok=True)


def running_now() -> str:
    """What the worker's live pool processes run, comma-separated; "" when idle."""
    found = []
    try:
        entries = sorted(_running_folder().iterdir())
    except OSError:
        return ""
    for path in entries:
        if not path.name.isdigit() or not _alive(int(path.name)):
            path.unlink(missing_ok=True)  # a pool process that died mid-experiment
            continue
        with contextlib.suppress(OSError):
            found.append(path.read_text())
    return ", ".join(found)[:200]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class RemoteHeartbeat(Periodic):
    """Tells the web, every few seconds, who this worker is and what it runs. A refusal
    (revoked, another release) calls `on_refused` with the web's words once."""

    thread_name = "infraops-web-heartbeat"

    def __init__(self, queues: list[str], on_refused: Callable[[str], None],
                 web: WebClient | None = None, interval: float = 5.0) -> None:
        super().__init__(interval)
        self.queues = queues
        self.on_refused = on_refused
        self.web = web or client()
        self.gpus = accelerators()
        self.refused = ""

    def report(self) -> dict[str, Any]:
        return {"host": socket.gethostname(), "queues": self.queues,
                "accelerators": self.gpus, "running": running_now(), "pid": os.getpid()}

    def tick(self) -> None:
        if self.refused:
            return
        try:
            self.web.heartbeat(self.report())
        except WebRefused as exc:
            if exc.status in (401, 403, 409):
                self.refused = str(exc)
                log.error("%s: this worker stops taking tasks", exc)
                self.on_refused(str(exc))
