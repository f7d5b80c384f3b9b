"""Thin Celery tasks of the agent: one step per task.

While a step runs, Redis holds STEP_PREFIX<run id> = (step number, worker, boot token): the
reaper (services.runs_reap) re-queues a step whose worker is gone, within a beat of its
restart instead of the broker's visibility timeout (1.5 h) or the idle-run reaper (10 min).
"""

from __future__ import annotations

import json
import logging
from typing import Any

import redis
from celery import shared_task
from django.conf import settings
from django.db import InterfaceError, OperationalError, close_old_connections, connection

from agents import services

log = logging.getLogger(__name__)

STEP_PREFIX = "infraops:agent-step:"
DB_RETRIES = 3  # a step that lost its database connection is taken again this many times


def _redis() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)


def _step_record(run_id: int, number: int, worker: str | None) -> str:
    """The record of this step on this worker; '' outside a worker (an eager call, a test),
    where nothing can be lost."""
    from infraops.experiments.workers import this_boot

    name, boot = this_boot()
    worker = worker or name
    if not worker or not boot:
        return ""
    return json.dumps({"number": number, "worker": worker, "boot": boot})


def _step_started(run_id: int, record: str) -> None:
    if not record:
        return
    try:
        _redis().set(f"{STEP_PREFIX}{run_id}", record, ex=settings.TASK_TIME_LIMIT + 120)
    except redis.RedisError:
        log.warning("cannot record that a step of run %s started", run_id)


# Delete the key only if it still holds this step's record: the next step, queued on commit,
# may already have started on another pool process and written its own.
_DELETE_IF_MINE = "if redis.call('get', KEYS[1]) == ARGV[1] then redis.call('del', KEYS[1]) end"


def _step_ended(run_id: int, record: str) -> None:
    if not record:
        return
    try:
        _redis().eval(_DELETE_IF_MINE, 1, f"{STEP_PREFIX}{run_id}", record)
    except redis.RedisError:
        log.warning("cannot clear the record of a step of run %s", run_id)


def orphaned_steps() -> dict[int, tuple[int, str]]:
    """{run id: (step number, record)} of steps whose task started on a worker that is gone
    (killed, or restarted under the same name). Raises RedisError when Redis cannot answer."""
    from infraops.experiments.workers import boot_alive

    client = _redis()
    orphans: dict[int, tuple[int, str]] = {}
    for key in client.scan_iter(match=f"{STEP_PREFIX}*", count=500):
        raw = client.get(key)
        text = raw.decode() if isinstance(raw, bytes) else str(raw or "")
        try:
            record: dict[str, Any] = json.loads(text) if text else {}
            run_id = int(key.decode().removeprefix(STEP_PREFIX))
        except ValueError:
            continue
        if record and not boot_alive(str(record["worker"]), str(record["boot"])):
            orphans[run_id] = (int(record["number"]), text)
    return orphans


def forget_step(run_id: int, record: str) -> None:
    _step_ended(run_id, record)


@shared_task(bind=True, acks_late=True, reject_on_worker_lost=True)
def agent_step(self: Any, run_id: int, number: int) -> None:
    """Take step `number` of run `run_id`. Safe twice: a taken step number is skipped."""
    record = _step_record(run_id, number, self.request.hostname)
    _step_started(run_id, record)
    try:
        services.run_step(run_id=run_id, number=number)
    except (OperationalError, InterfaceError) as exc:
        # The database connection broke (a restarted or failed-over server, a terminated
        # backend): reconnect and take the step again; pause only if that keeps failing.
        _drop_broken_connection()
        if (self.request.retries or 0) < DB_RETRIES and not self.request.is_eager:
            log.warning("step %s of run %s lost the database (%s): taking it again",
                        number, run_id, exc)
            raise self.retry(countdown=2, max_retries=DB_RETRIES) from exc
        _pause_for(run_id, number, exc)
    except Exception as exc:
        # A bug or an outage must not leave the run 'running' with nothing queued: it pauses
        # with the reason, and an engineer resumes it once the cause is fixed.
        _pause_for(run_id, number, exc)
    finally:
        _step_ended(run_id, record)


def _drop_broken_connection() -> None:
    if not connection.in_atomic_block:  # a test's transaction is never dropped
        close_old_connections()


def _pause_for(run_id: int, number: int, exc: BaseException) -> None:
    log.error("step %s of run %s failed", number, run_id, exc_info=exc)
    services.run_pause_for_error(run_id=run_id, error=exc)


@shared_task
def runs_reap() -> list[int]:
    return services.runs_reap()
