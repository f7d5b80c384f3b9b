"""The Celery application; configuration comes from Django settings (CELERY_*)."""

from __future__ import annotations

import logging
import os
import signal
import uuid
import warnings
from typing import TYPE_CHECKING, Any

import redis
from celery import Celery
from celery.exceptions import SecurityWarning
from celery.signals import (
    task_postrun,
    task_prerun,
    worker_init,
    worker_process_init,
    worker_ready,
    worker_shutdown,
)
from kombu.transport import redis as kombu_redis

if TYPE_CHECKING:
    from infraops.experiments.orphans import OrphanReaper
    from infraops.experiments.remote import RemoteHeartbeat
    from infraops.experiments.workers import Heartbeat

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "infraops.project.settings")

# The worker runs as root on purpose: it starts each probe in bubblewrap as an unprivileged
# sandbox uid, inside control groups it makes, and only root may. Celery's warning about root
# workers is there for pickled messages, which a root worker would unpickle; this app accepts
# JSON only (CELERY_ACCEPT_CONTENT), so the warning says nothing the operator can act on.
warnings.filterwarnings("ignore", message="You're running the worker with superuser",
                        category=SecurityWarning)

app = Celery("infraops")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
_heartbeat: Heartbeat | None = None
_web_heartbeat: RemoteHeartbeat | None = None
_orphans: OrphanReaper | None = None
log = logging.getLogger(__name__)


def _is_prefork(pool_cls: Any) -> bool:
    from celery import concurrency
    from celery.concurrency.prefork import TaskPool

    implementation = concurrency.get_implementation(pool_cls)
    return isinstance(implementation, type) and issubclass(implementation, TaskPool)


@worker_init.connect
def _adopt_orphans(sender: Any, **kwargs: Any) -> None:
    """Before the pool forks: a prefork worker's main process becomes the reaper of what
    its pool processes leave behind when they die (infraops.experiments.orphans)."""
    from infraops.experiments.orphans import become_subreaper

    if _is_prefork(sender.pool_cls) and not become_subreaper():
        log.warning("cannot become a child subreaper: a killed pool process may leave "
                    "processes behind")


def _pool_processes(pool: Any) -> set[int]:
    info = pool.info if pool is not None else {}
    return set(info.get("processes", ()))


# --- riding out a broker outage ------------------------------------------------------------
#
# Celery 5.7.0 closes the consumer's broken connection inline when the broker goes away
# (Consumer.on_connection_error_after_connected: collect(), then close()). collect() detaches
# the kombu Transport (transport.client = None) while the default channel is still open; if a
# late-acked task is running, close() makes that channel restore its unacked message, which
# builds a new Redis pool from transport.client: AttributeError "'NoneType' object has no
# attribute 'hostname'" (kombu.transport.redis.Channel._connparams). An AttributeError is not
# a connection error, so the worker logged "Unrecoverable error" and exited (seen in 2 of 3
# Redis kills with a task running). The ack of that task, once it ends, takes the same path.
# celery and kombu 5.7.0 are the newest releases; no pin avoids it. A channel whose connection
# was closed now says so as a connection error, which Celery already handles: the close goes
# on, the ack is logged as lost ("Couldn't ack") and the message stays in the unacked set
# (a step is safe twice), and the consumer reconnects.
_connparams = getattr(kombu_redis.Channel, "_connparams")  # noqa: B009


def _connparams_of_open_channel(self: Any, *args: Any, **kwargs: Any) -> Any:
    transport = getattr(self, "connection", None)
    if transport is None or getattr(transport, "client", None) is None:
        raise redis.exceptions.ConnectionError("the broker connection was closed")
    return _connparams(self, *args, **kwargs)


setattr(kombu_redis.Channel, "_connparams", _connparams_of_open_channel)  # noqa: B010

# A worker's pool processes wait this long for the broker when they queue follow-up work
# (a run's next step, a wake-up): a step that ends during a Redis outage queues the next one
# when Redis is back instead of failing. Web processes keep Celery's short default, so a page
# answers at once that the queue is down (agents.services.run_start).
WORKER_PUBLISH_RETRY_POLICY = {"max_retries": 60, "interval_start": 0.5, "interval_step": 0.5,
                               "interval_max": 3.0}
WORKER_PUBLISH_WAIT_SECONDS = 170  # about what the 60 tries of the policy add up to

# --- which worker process runs a step ------------------------------------------------------
#
# Each worker (main process) has a boot token, which its heartbeat keeps alive in Redis
# (infraops.experiments.workers.boot_alive). A step task records the token of the worker it runs on
# (agents.tasks); the reaper re-queues a step whose worker's key expired or names another boot
# (the worker was killed, or restarted under the same name).
worker_boot = ""


@worker_init.connect
def _name_this_boot(sender: Any, **kwargs: Any) -> None:
    """Before the pool forks, so its processes inherit the token."""
    global worker_boot
    worker_boot = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
    # For pool processes however started (infraops.experiments.workers.this_boot reads them).
    os.environ["INFRAOPS_WORKER_BOOT"] = worker_boot
    os.environ["INFRAOPS_WORKER_NAME"] = str(getattr(sender, "hostname", "") or "")


@worker_ready.connect
def _start_heartbeat(sender: Any, **kwargs: Any) -> None:
    """Announce which queues this worker consumes (see infraops.experiments.workers)."""
    from infraops.experiments.workers import Heartbeat

    queues = sorted(q.name for q in sender.app.amqp.queues.consume_from.values())
    global _heartbeat
    _heartbeat = Heartbeat(sender.hostname, queues, boot=worker_boot)
    _heartbeat.start()
    _start_web_heartbeat(queues)
    controller = getattr(sender, "controller", None)
    if controller is not None and _is_prefork(controller.pool_cls):
        from infraops.experiments.orphans import OrphanReaper

        global _orphans
        _orphans = OrphanReaper(lambda: _pool_processes(controller.pool))
        _orphans.start()


def _start_web_heartbeat(queues: list[str]) -> None:
    """A worker on another host (INFRAOPS_WEB_URL) also reports to the web: host, release,
    queues, GPUs, what it runs (infraops.experiments.remote). When the web refuses it (its
    token revoked, another release) it stops taking tasks: a warm shutdown of this worker."""
    from django.conf import settings

    if not settings.WEB_URL:
        return
    from infraops.experiments.remote import RemoteHeartbeat

    def stop(reason: str) -> None:
        log.error("the web refuses this worker, which stops: %s", reason)
        os.kill(os.getpid(), signal.SIGTERM)

    global _web_heartbeat
    _web_heartbeat = RemoteHeartbeat(queues, on_refused=stop)
    _web_heartbeat.start()


@worker_shutdown.connect
def _stop_heartbeat(sender: Any, **kwargs: Any) -> None:
    if _heartbeat is not None:
        _heartbeat.stop()
    if _web_heartbeat is not None:
        _web_heartbeat.stop()
    if _orphans is not None:
        _orphans.stop()


@task_prerun.connect
@task_postrun.connect
def _recycle_database_connections(**kwargs: Any) -> None:
    """Per task what Django does per request: drop a connection that is broken, in a failed
    state or older than CONN_MAX_AGE, and keep a healthy one (CELERY_DB_REUSE_MAX)."""
    from django.db import close_old_connections

    close_old_connections()


@worker_process_init.connect
def _wait_for_the_broker_when_queueing(**kwargs: Any) -> None:
    app.conf.task_publish_retry_policy = WORKER_PUBLISH_RETRY_POLICY
    # The retry policy covers a publish on a channel that broke. A pool process that has not
    # published yet first opens its connection, and kombu gives that up after the connect
    # timeout (4 s): a step that ended during an outage failed its run (seen 1 run in 4 of
    # tests/e2e/test_faults.py, whenever the step fell to a fresh pool process). Opening the
    # connection waits as long as the policy. Pool processes publish and never consume.
    policy = WORKER_PUBLISH_RETRY_POLICY
    app.conf.broker_transport_options = {
        **(app.conf.broker_transport_options or {}),
        "max_retries": policy["max_retries"], "interval_start": policy["interval_start"],
        "interval_step": policy["interval_step"], "interval_max": policy["interval_max"],
        "connect_retries_timeout": WORKER_PUBLISH_WAIT_SECONDS,
    }
    app.amqp.__dict__.pop("send_task_message", None)  # built from the policy once, lazily


@worker_process_init.connect
def _check_sandbox_early(**kwargs: Any) -> None:
    """A process that runs experiments starts its (cached) sandbox check now: a host that
    cannot confine probes says so in the log at start, and the first experiment does not pay
    for the check. Experiments still fail with the reason (infraops.experiments.services)."""
    queues = app.amqp.queues.consume_from or {}
    if not any(name.split(".")[0] == "experiments" for name in queues):
        return
    from infraops.experiments import sandbox

    problem = sandbox.sandbox_check()
    if problem is not None:
        log.error("this worker cannot run probes: %s", problem)
