"""The Celery application; configuration comes from Django settings (CELERY_*)."""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

from celery import Celery
from celery.signals import (
    task_postrun,
    task_prerun,
    worker_process_init,
    worker_ready,
    worker_shutdown,
)

if TYPE_CHECKING:
    from infraops.workers import Heartbeat

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "infraops.settings")

app = Celery("infraops")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
_heartbeat: Heartbeat | None = None
log = logging.getLogger(__name__)


@worker_ready.connect
def _start_heartbeat(sender: Any, **kwargs: Any) -> None:
    """Announce which queues this worker consumes (see infraops.workers)."""
    from infraops.workers import Heartbeat

    queues = sorted(q.name for q in sender.app.amqp.queues.consume_from.values())
    global _heartbeat
    _heartbeat = Heartbeat(sender.hostname, queues)
    _heartbeat.start()


@worker_shutdown.connect
def _stop_heartbeat(sender: Any, **kwargs: Any) -> None:
    if _heartbeat is not None:
        _heartbeat.stop()


@task_prerun.connect
@task_postrun.connect
def _recycle_database_connections(**kwargs: Any) -> None:
    """Per task what Django does per request: drop a connection that is broken, in a failed
    state or older than CONN_MAX_AGE, and keep a healthy one (CELERY_DB_REUSE_MAX)."""
    from django.db import close_old_connections

    close_old_connections()


@worker_process_init.connect
def _check_sandbox_early(**kwargs: Any) -> None:
    """A process that runs experiments starts its (cached) sandbox check now: a host that
    cannot confine probes says so in the log at start, and the first experiment does not pay
    for the check. Experiments still fail with the reason (infraops.services.experiments)."""
    queues = app.amqp.queues.consume_from or {}
    if not any(name.split(".")[0] == "experiments" for name in queues):
        return
    from infraops import sandbox

    problem = sandbox.sandbox_check()
    if problem is not None:
        log.error("this worker cannot run probes: %s", problem)
