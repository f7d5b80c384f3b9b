"""A worker's pool process that queues follow-up work during a broker outage waits for the
broker, even when it has never opened a connection (infraops.project.celery: the connection's own
retries, not only the publish retry policy)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import free_port

CHILD = textwrap.dedent("""
    import os, sys, time
    os.environ["DJANGO_SETTINGS_MODULE"] = "infraops.project.settings"
    import django
    django.setup()
    from infraops.project import celery as worker_process
    from infraops.project.celery import app
    worker_process._wait_for_the_broker_when_queueing()  # as worker_process_init does
    started = time.monotonic()
    with app.producer_or_acquire() as producer:
        producer.publish({"hello": 1}, routing_key="publish-wait-test", retry=True,
                         retry_policy=app.conf.task_publish_retry_policy)
    print(f"published after {time.monotonic() - started:.1f} s", flush=True)
""")


@pytest.mark.skipif(not Path("/usr/bin/redis-server").exists(), reason="needs redis-server")
def test_a_fresh_pool_process_publishes_once_the_broker_is_back(tmp_path: Path) -> None:
    port = free_port()
    env = os.environ | {"REDIS_URL": f"redis://127.0.0.1:{port}/0",
                        "SECRET_KEY": "publish-wait-test", "INFRAOPS_DATA": str(tmp_path)}
    child = subprocess.Popen([sys.executable, "-c", CHILD], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    redis = None
    try:
        time.sleep(8)  # past kombu's 4 s connect timeout, which used to end the publish
        assert child.poll() is None, child.communicate()[0][-3000:]
        redis = subprocess.Popen(["/usr/bin/redis-server", "--port", str(port), "--bind",
                                  "127.0.0.1", "--save", "", "--appendonly", "no"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        output, _ = child.communicate(timeout=120)
        assert child.returncode == 0, output[-3000:]
        assert "published after" in output
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        if redis is not None:
            redis.terminate()
            redis.wait(timeout=20)
