"""The fleet over HTTP: what workers on other hosts call (heartbeat, git, blobs) and the
staff's fleet page.

Every worker endpoint is CSRF-exempt (no browser, no cookie) and authenticated on every
request by the worker's token and release (infraops.experiments.fleet.worker_authenticate).
Every refusal is JSON `{"error": "<words>"}` with its status; bad input is never a 500.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import json
import tempfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, cast

from django.conf import settings
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import (
    FileResponse,
    HttpRequest,
    HttpResponse,
    HttpResponseBase,
    JsonResponse,
    StreamingHttpResponse,
)
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from infraops import gitops
from infraops.access import AuthenticatedHttpRequest
from infraops.experiments.blobs import CHUNK
from infraops.experiments.blobstore import BlobMissing, StorageBlobStore, blob_name
from infraops.experiments.fleet import (
    HEARTBEAT_SECONDS,
    WorkerRefused,
    worker_authenticate,
    worker_heartbeat,
    worker_push_refusal,
    worker_revoke,
    worker_state,
)
from infraops.models import Target, Worker
from infraops.version import VERSION

# The most a git request's body may hold once uncompressed (a push's pack included).
GIT_BODY_MAX_BYTES = 8 << 30
GIT_SERVICES = ("git-upload-pack", "git-receive-pack")

STATE_BADGES = {"live": "pass", "stale": "warn", "revoked": "fail", "never seen": "info"}

WorkerView = Callable[..., HttpResponseBase]


def refusal(message: str, status: int) -> JsonResponse:
    response = JsonResponse({"error": message}, status=status)
    if status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="infraops-workers"'
    return response


def worker_api(*methods: str) -> Callable[[WorkerView], Callable[..., HttpResponseBase]]:
    """A worker endpoint taking `methods`: the view gets the authenticated worker after the
    request; a WorkerRefused anywhere becomes its JSON answer."""

    def decorate(view: WorkerView) -> Callable[..., HttpResponseBase]:
        @csrf_exempt
        @functools.wraps(view)
        def wrapped(request: HttpRequest, **kwargs: Any) -> HttpResponseBase:
            try:
                worker = worker_authenticate(request.headers.get("Authorization", ""),
                                             request.headers.get("X-InfraOps-Version", ""))
                if request.method not in methods:
                    response = refusal(f"{request.method} is not served here; use "
                                       f"{' or '.join(methods)}", 405)
                    response["Allow"] = ", ".join(methods)
                    return response
                return view(request, worker, **kwargs)
            except WorkerRefused as refused:
                return refusal(refused.message, refused.status)

        return wrapped

    return decorate


@worker_api("POST")
def heartbeat(request: HttpRequest, worker: Worker) -> JsonResponse:
    try:
        report = json.loads(request.body)
    except ValueError:
        raise WorkerRefused("bad heartbeat: the body is not JSON", 400) from None
    worker_heartbeat(worker=worker, report=report, version=VERSION)
    return JsonResponse({"worker": worker.name, "queues": worker.queues,
                         "heartbeat_s": HEARTBEAT_SECONDS})


# --- blobs ------------------------------------------------------------------------------------

def _blob_name(sha256: str) -> str:
    try:
        return blob_name(sha256)
    except ValueError:
        raise WorkerRefused(f"{sha256[:80]!r} is not a blob name: a sha256 in 64 lowercase hex "
                            "digits", 400) from None


@worker_api("GET", "PUT")
def blob(request: HttpRequest, worker: Worker, sha256: str) -> HttpResponseBase:
    name = _blob_name(sha256)
    store = StorageBlobStore()  # the web's own store, whatever a worker would use
    if request.method == "PUT":
        return _blob_put(request, store, sha256)
    try:
        handle = store.open(sha256)
    except BlobMissing:
        return refusal(f"no blob {sha256} here", 404)
    response = FileResponse(handle, content_type="application/octet-stream")
    response["Content-Length"] = str(store.storage.size(name))
    return response


def _declared_length(request: HttpRequest) -> int:
    text = request.headers.get("Content-Length", "")
    if not text.strip():
        raise WorkerRefused("send Content-Length with the blob (a chunked upload is not taken)",
                            411)
    if not text.strip().isdigit():
        raise WorkerRefused(f"Content-Length {text[:40]!r} is not a number of bytes", 400)
    if int(text) > settings.BLOB_MAX_BYTES:
        raise WorkerRefused(f"the blob is {int(text)} bytes; the most this web takes is "
                            f"{settings.BLOB_MAX_BYTES} (INFRAOPS_BLOB_MAX_BYTES)", 413)
    return int(text)


def _blob_put(request: HttpRequest, store: StorageBlobStore, sha256: str) -> JsonResponse:
    """Stream the body to a temporary file while hashing it; store it only when it is whole
    and its sha256 is the one named (the store renames a finished file into place)."""
    declared = _declared_length(request)
    uploads = Path(settings.DATA_DIR) / "uploads"
    uploads.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=uploads) as spool:
        digest, size = hashlib.sha256(), 0
        while chunk := request.read(CHUNK):
            size += len(chunk)
            if size > min(declared, settings.BLOB_MAX_BYTES):
                raise WorkerRefused(f"the body is longer than its Content-Length {declared} or "
                                    f"the most this web takes ({settings.BLOB_MAX_BYTES})", 413)
            digest.update(chunk)
            spool.write(chunk)
        spool.flush()
        if size != declared:
            raise WorkerRefused(f"the body ended after {size} of {declared} bytes", 400)
        if digest.hexdigest() != sha256:
            raise WorkerRefused(f"the content's sha256 is {digest.hexdigest()}, not {sha256}: "
                                "nothing stored", 400)
        if store.exists(sha256):
            return JsonResponse({"sha256": sha256, "size": size}, status=200)
        store.put(Path(spool.name))
    return JsonResponse({"sha256": sha256, "size": size}, status=201)


# --- git over HTTP ----------------------------------------------------------------------------

def _git_service(request: HttpRequest, path: str) -> str:
    """The git service a request asks for; WorkerRefused for anything but smart HTTP."""
    if path == "info/refs":
        service = request.GET.get("service", "")
        if service not in GIT_SERVICES:
            raise WorkerRefused("only git's smart HTTP is served: info/refs?service="
                                "git-upload-pack or git-receive-pack", 400)
        if request.method != "GET":
            raise WorkerRefused("info/refs is read with GET", 405)
        return service
    if request.method != "POST":
        raise WorkerRefused(f"{path} takes POST", 405)
    return path


def _git_body(request: HttpRequest) -> IO[bytes]:
    """The request's body as a real file, uncompressed when git sent it gzipped."""
    encoding = request.headers.get("Content-Encoding", "").strip().lower()
    if encoding not in ("", "identity", "gzip", "x-gzip"):
        raise WorkerRefused(f"Content-Encoding {encoding[:40]!r} is not taken (gzip is)", 415)
    source: Any = request
    if "gzip" in encoding:
        source = gzip.GzipFile(fileobj=cast(Any, request), mode="rb")
    body = tempfile.TemporaryFile()  # noqa: SIM115 (closed by the response)
    size = 0
    try:
        while chunk := source.read(CHUNK):
            size += len(chunk)
            if size > GIT_BODY_MAX_BYTES:
                raise WorkerRefused(f"the git request is over {GIT_BODY_MAX_BYTES} bytes", 413)
            body.write(chunk)
    except (OSError, EOFError, zlib.error):
        body.close()
        raise WorkerRefused("the gzip body of the git request is broken", 400) from None
    except WorkerRefused:
        body.close()
        raise
    body.seek(0)
    return body


def _closing(chunks: Iterator[bytes], body: IO[bytes] | None) -> Iterator[bytes]:
    try:
        yield from chunks
    finally:
        if hasattr(chunks, "close"):
            chunks.close()
        if body is not None:
            body.close()


@worker_api("GET", "POST")
def git_smart(request: HttpRequest, worker: Worker, pk: int, path: str) -> HttpResponseBase:
    service = _git_service(request, path)
    target = Target.objects.filter(pk=pk).first()
    if target is None or not (target.clone_path / "HEAD").is_file():
        return refusal(f"there is no target {pk} with a repository here", 404)
    body = _git_body(request) if request.method == "POST" else None
    if body is not None and service == "git-receive-pack":
        try:
            reason = worker_push_refusal(worker, target, gitops.receive_pack_commands(body))
        except gitops.GitError as error:
            body.close()
            return refusal(str(error), 400)
        if reason:
            body.close()
            return refusal(f"push refused, no ref changed: {reason}", 403)
        body.seek(0)
    answer = gitops.http_backend(
        target.clone_path, path=f"/{path}", method=request.method or "GET",
        query=request.META.get("QUERY_STRING", ""),
        content_type=request.META.get("CONTENT_TYPE", ""), body=body, user=worker.name)
    response = StreamingHttpResponse(_closing(answer.body, body), status=answer.status)
    for name, value in answer.headers:
        response[name] = value
    return response


@worker_api("GET", "POST", "PUT", "PATCH", "DELETE")
def git_unknown(request: HttpRequest, worker: Worker, rest: str) -> JsonResponse:
    return refusal("not a git address served here: /fleet/git/target-<N>.git/info/refs, "
                   "git-upload-pack or git-receive-pack", 404)


# --- the fleet page ---------------------------------------------------------------------------

def _staff(request: AuthenticatedHttpRequest) -> None:
    if not (request.user.is_staff or request.user.is_superuser):
        raise PermissionDenied("The fleet page is for staff.")


def fleet_page(request: AuthenticatedHttpRequest) -> HttpResponse:
    _staff(request)
    workers = Worker.objects.select_related("created_by", "revoked_by").order_by("name")
    return render(request, "infraops/fleet.html", {"rows": [_row(w) for w in workers],
                                                    "web_version": VERSION})


def _accelerator(item: dict[str, Any]) -> str:
    """ "NVIDIA H200 (143771 MiB)", as the heartbeat reported it."""
    name = str(item.get("model") or item.get("kind") or "?")
    return f"{name} ({item['memory_mib']} MiB)" if item.get("memory_mib") else name


def _row(worker: Worker) -> dict[str, Any]:
    state = worker_state(worker)
    return {"worker": worker, "state": state, "badge": STATE_BADGES[state],
            "gpus": [_accelerator(item) for item in worker.accelerators if isinstance(item, dict)],
            "other_version": bool(worker.version) and worker.version != VERSION}


@require_POST
def fleet_revoke(request: AuthenticatedHttpRequest, name: str) -> HttpResponse:
    _staff(request)
    worker = get_object_or_404(Worker, name=name)
    if request.POST.get("confirm") != "yes":
        messages.error(request, f"Worker {worker.name} was not revoked: tick the box that says "
                       "its token is refused from now on, then press Revoke.")
        return redirect("fleet:page")
    worker_revoke(worker=worker, by=request.user)
    messages.success(request, f"Worker {worker.name} is revoked: its token is refused from now "
                     "on. Register a new worker to give its host a new token.")
    return redirect("fleet:page")
