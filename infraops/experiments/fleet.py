"""Workers on other hosts: registration, their tokens, their heartbeats, what they may push.

A worker on another host shares PostgreSQL and Redis with the web, and reaches the git data
and the blobs over HTTPS (infraops/experiments/fleet_views.py), sending its token and its
release on every request. No HTTP here: the views turn `WorkerRefused` into the JSON answer.

Contracts:
- A token is "iow_" + an 8-character prefix + "_" + token_urlsafe(32). It is returned once,
  by `worker_register`; the row keeps the prefix (to find the row) and the sha256 of the
  whole token (compared in constant time).
- `worker_authenticate` runs on every request: a missing, malformed or unknown token is a
  401, a revoked worker a 403, another release a 409; each message says what to do.
- `worker_may_push` allows only the agent runs' own branches, to workers that consume the
  "agent" queue, and only while a check registered by the app that knows runs
  (`PUSH_CHECKS`, filled by agents.apps) says the run is live on that target.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.utils import timezone

from infraops.errors import DomainError
from infraops.gitops import PushCommand
from infraops.models import Target, Worker
from infraops.services.audit import audit_record
from infraops.version import VERSION

TOKEN_PREFIX = "iow_"  # noqa: S105 (the tokens' format, not a secret)
HEARTBEAT_SECONDS = 5
# A worker heard from within this many heartbeats is live; older is stale.
LIVE_BEATS = 3
AGENT_QUEUE = "agent"

_TOKEN = re.compile(r"iow_([A-Za-z0-9]{8})_([A-Za-z0-9_-]{43})")
_QUEUE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
_RUN_REF = re.compile(r"refs/heads/infraops/run-([1-9][0-9]{0,17})(?:-h[1-9][0-9]{0,17})?")
NOT_SENT = ("no worker token: send Authorization: Bearer <token> (INFRAOPS_WORKER_TOKEN), as "
            "`manage.py worker_register` printed it")

# (worker, target, run number) -> None when the run may take a push, else the reason. Filled
# by the apps above the core (agents.apps): the core cannot know runs.
PushCheck = Callable[[Worker, Target | None, int], "str | None"]
PUSH_CHECKS: list[PushCheck] = []


@dataclass
class WorkerRefused(Exception):
    """A worker's request was refused; `message` is a sentence for its operator."""

    message: str
    status: int

    def __str__(self) -> str:
        return self.message


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def queues_parse(text: str | list[str]) -> list[str]:
    """Queue names from "experiments, experiments.gpu" or a list; DomainError in words for
    an empty list or a name Celery could not route to."""
    names = [name.strip() for name in (text.split(",") if isinstance(text, str) else text)]
    names = [name for name in names if name]
    if not names:
        raise DomainError("a worker needs at least one queue, such as experiments.")
    for name in names:
        if not _QUEUE.fullmatch(name):
            raise DomainError(f"{name!r} is not a queue name: letters, digits, '.', '_' and "
                              "'-' only, such as experiments.gpu.")
    return list(dict.fromkeys(names))


def worker_register(*, name: str, queues: list[str], by: User | None) -> tuple[Worker, str]:
    """A new worker and its token, which is returned here once and never stored."""
    if Worker.objects.filter(name=name).exists():
        raise DomainError(f"a worker named {name!r} exists already: choose another name, or "
                          "revoke it and register a new one under a new name.")
    prefix = "".join(secrets.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(8))
    token = f"{TOKEN_PREFIX}{prefix}_{secrets.token_urlsafe(32)}"
    try:
        with transaction.atomic():
            worker = Worker.objects.create(name=name, queues=queues_parse(queues),
                                           token_prefix=prefix, token_hash=token_hash(token),
                                           created_by=by)
            audit_record(actor=by, action="worker.register", obj=worker,
                         data={"name": name, "queues": worker.queues})
    except IntegrityError:  # registered by someone else since the check above
        raise DomainError(f"a worker named {name!r} exists already.") from None
    return worker, token


def worker_revoke(*, worker: Worker, by: User | None) -> None:
    """Refuse the worker's token from now on (its next request answers 403). Revoking a
    revoked worker changes nothing and records nothing."""
    with transaction.atomic():
        revoked = Worker.objects.filter(pk=worker.pk, revoked_at__isnull=True).update(
            revoked_at=timezone.now(), revoked_by=by)
        if not revoked:
            return
        worker.refresh_from_db()
        audit_record(actor=by, action="worker.revoke", obj=worker,
                     data={"name": worker.name, "host": worker.host})


def _bearer(authorization_header: str) -> str:
    scheme, _, token = authorization_header.strip().partition(" ")
    if not authorization_header.strip():
        raise WorkerRefused(NOT_SENT, 401)
    if scheme.lower() != "bearer" or not _TOKEN.fullmatch(token.strip()):
        raise WorkerRefused("malformed worker token: send Authorization: Bearer iow_<prefix>_"
                            "<secret>, the whole token `manage.py worker_register` printed",
                            401)
    return token.strip()


def worker_authenticate(authorization_header: str, version_header: str) -> Worker:
    """The worker the token names, checked for revocation and for the release it runs."""
    token = _bearer(authorization_header)
    prefix = token[len(TOKEN_PREFIX):len(TOKEN_PREFIX) + 8]
    wanted = token_hash(token)
    worker = next((row for row in Worker.objects.filter(token_prefix=prefix)
                   .select_related("revoked_by")
                   if hmac.compare_digest(row.token_hash, wanted)), None)
    if worker is None:
        raise WorkerRefused("unknown worker token: no registered worker has it (was it "
                            "copied whole?); an admin registers workers with `manage.py "
                            "worker_register`", 401)
    if worker.revoked_at is not None:
        by = worker.revoked_by.get_username() if worker.revoked_by else "an admin"
        raise WorkerRefused(f"worker {worker.name!r} was revoked on "
                            f"{worker.revoked_at:%Y-%m-%d %H:%M} UTC by {by}: an admin must "
                            "register a new worker and give it the new token", 403)
    version = version_header.strip()
    if version != VERSION:
        raise WorkerRefused(f"worker version {version or '(none sent)'}, web version {VERSION}: "
                            "run the same release on both", 409)
    return worker


def _report_problem(report: Any) -> str | None:
    """What is wrong with a heartbeat's body, in words; None when its shape is right."""
    if not isinstance(report, dict):
        return "the heartbeat must be a JSON object"
    for key, kind in (("host", str), ("running", str)):
        if key in report and not isinstance(report[key], kind):
            return f"{key!r} must be a string"
    if not isinstance(report.get("host"), str) or not report["host"].strip():
        return "'host' (the worker's host name) is required"
    if "pid" in report and report["pid"] is not None and (
            type(report["pid"]) is not int or report["pid"] <= 0):
        return "'pid' must be a positive integer"
    if "queues" in report and not (isinstance(report["queues"], list)
                                   and all(isinstance(q, str) for q in report["queues"])):
        return "'queues' must be a list of queue names"
    accelerators = report.get("accelerators", [])
    if not isinstance(accelerators, list):
        return "'accelerators' must be a list"
    for index, item in enumerate(accelerators):
        problem = _accelerator_problem(item)
        if problem:
            return f"accelerators[{index}]: {problem}"
    return None


def _accelerator_problem(item: Any) -> str | None:
    if not isinstance(item, dict):
        return "must be an object such as {\"kind\": \"gpu\", \"model\": \"NVIDIA H200\", ...}"
    for key in ("kind", "model", "driver"):
        if key in item and not isinstance(item[key], str):
            return f"{key!r} must be a string"
    if not isinstance(item.get("kind"), str) or not item["kind"]:
        return "'kind' (such as \"gpu\") is required"
    for key in ("memory_mib", "index"):
        if key in item and item[key] is not None and (
                type(item[key]) is not int or item[key] < 0):
            return f"{key!r} must be a non-negative integer"
    return None


def worker_heartbeat(*, worker: Worker, report: Any, version: str = VERSION) -> None:
    """Record what the worker reports (host, accelerators, pid, what it runs) and when."""
    problem = _report_problem(report)
    if problem:
        raise WorkerRefused(f"bad heartbeat: {problem}", 400)
    accelerators = [{key: item[key] for key in ("kind", "model", "memory_mib", "driver", "index")
                     if key in item} for item in report.get("accelerators", [])]
    Worker.objects.filter(pk=worker.pk).update(
        host=report["host"].strip()[:255], version=version[:40], accelerators=accelerators,
        pid=report.get("pid"), running=str(report.get("running") or "")[:200],
        last_seen_at=timezone.now())


def worker_state(worker: Worker) -> str:
    """"revoked", "live" (heard from within LIVE_BEATS heartbeats), "stale" or "never seen"."""
    if worker.revoked_at is not None:
        return "revoked"
    if worker.last_seen_at is None:
        return "never seen"
    age = (timezone.now() - worker.last_seen_at).total_seconds()
    return "live" if age <= HEARTBEAT_SECONDS * LIVE_BEATS else "stale"


def worker_may_push(worker: Worker, ref: str, target: Target | None = None) -> str | None:
    """None when `worker` may set `ref` (of `target`), else the reason in words. Deletions
    are refused by the caller, which sees the zero id (infraops/experiments/fleet_views.py)."""
    match = _RUN_REF.fullmatch(ref)
    if match is None:
        return (f"{ref} is not an agent run's branch: a worker may push only "
                "refs/heads/infraops/run-<N> and refs/heads/infraops/run-<N>-h<M>")
    if AGENT_QUEUE not in worker.queues:
        return (f"worker {worker.name!r} does not consume the {AGENT_QUEUE!r} queue, so it runs "
                "no agent steps and may push nothing")
    if not PUSH_CHECKS:
        return "no app checks which runs are live, so no push is allowed"
    for check in PUSH_CHECKS:
        reason = check(worker, target, int(match.group(1)))
        if reason:
            return reason
    return None


def worker_push_refusal(worker: Worker, target: Target,
                        commands: list[PushCommand]) -> str | None:
    """Why the whole push must be refused (one sentence), or None when every ref update may
    go ahead: a push is taken whole or not at all, so no ref changes on a refusal."""
    if not commands:
        return "the push names no ref to update"
    for command in commands:
        if command.is_deletion:
            return f"{command.ref}: a worker may not delete a ref"
        reason = worker_may_push(worker, command.ref, target)
        if reason:
            return reason
    return None
