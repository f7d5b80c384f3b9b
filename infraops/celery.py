"""The Celery application; configuration comes from Django settings (CELERY_*)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from celery import Celery
from celery.signals import worker_ready, worker_shutdown

if TYPE_CHECKING:
    from infraops.workers import Heartbeat

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "infraops.settings")

app = Celery("infraops")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
_heartbeat: Heartbeat | None = None


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
