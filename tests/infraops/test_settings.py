"""infraops/project/settings.py: malformed environment values stop start-up with one sentence, and
the
Celery and channel-layer settings follow the reliability rules of docs/product.md."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from celery.app.defaults import _OLD_SETTING_KEYS, SETTING_KEYS
from channels.layers import get_channel_layer
from django.conf import settings

from infraops.project.celery import app as celery_app
from tests.infraops.workers_harness import started_workers, wait_until

PREFIX = "InfraOps configuration error:"


def manage(*args: str, **overrides: str) -> subprocess.CompletedProcess[str]:
    env = os.environ.copy() | overrides
    return subprocess.run([sys.executable, "manage.py", *args], cwd=settings.BASE_DIR, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(("name", "value", "says"), [
    ("DATABASE_URL", "mysql://x/y", "PostgreSQL"),
    ("DATABASE_URL", "not a url", "not a url"),
    ("REDIS_URL", "http://x", "redis://"),
    ("DEBUG", "maybe", "maybe"),
    ("INFRAOPS_SECURE", "perhaps", "perhaps"),
    ("INFRAOPS_TASK_TIME_LIMIT", "ten", "ten"),
    ("INFRAOPS_TASK_TIME_LIMIT", "-5", "positive"),
    ("INFRAOPS_SANDBOX_UID_POOL", "1900000000", "first-last"),
    ("INFRAOPS_SANDBOX_UID_POOL", "0-10", "first-last"),
    ("INFRAOPS_SANDBOX_UID_POOL", "20-10", "first-last"),
    ("INFRAOPS_SANDBOX_UID_POOL", "a-b", "first-last"),
    ("INFRAOPS_SANDBOX_TOOLCHAINS", "/opt/torch/.venv:opt/cuda", "absolute path"),
    ("INFRAOPS_SANDBOX_GPU_DEVICES", "nvidia0", "absolute path"),
    ("INFRAOPS_SANDBOX_CGROUP", "sys/fs/cgroup/infraops", "absolute path"),
    ("INFRAOPS_GPU_WORKER", "maybe", "maybe"),
    ("INFRAOPS_BLOB_MAX_BYTES", "lots", "lots"),
    ("INFRAOPS_BLOB_MAX_BYTES", "0", "positive"),
    ("INFRAOPS_BLOB_STORAGE", "not a path", "dotted path"),
    ("INFRAOPS_BLOB_STORAGE_OPTIONS", "{bucket", "not JSON"),
    ("INFRAOPS_BLOB_STORAGE_OPTIONS", "[1]", "JSON object"),
    ("INFRAOPS_WEB_URL", "infraops.example.com", "http://"),
    ("INFRAOPS_WEB_RETRY_SECONDS", "soon", "soon"),
    ("INFRAOPS_EXPERIMENT_LEASE_SECONDS", "1", "between 5 and 3600"),
    ("INFRAOPS_LLM_TIMEOUT", "soon", "soon"),
    ("INFRAOPS_LLM_TIMEOUT", "0", "from 1 s to an hour"),
    ("INFRAOPS_LLM_TIMEOUT", "7200", "from 1 s to an hour"),
    ("INFRAOPS_WEB_PROCESSES", "0", "from 1 to 32"),
])
def test_a_malformed_value_stops_manage_py_with_one_sentence_naming_the_variable(
    name: str, value: str, says: str
) -> None:
    result = manage("check", **{name: value})

    assert result.returncode == 1, result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith(PREFIX)]
    assert len(errors) == 1, result.stderr
    assert name in errors[0]
    assert says in errors[0]
    assert "Traceback" not in result.stderr
    assert "System check identified" not in result.stdout


def test_valid_values_pass_the_check() -> None:
    # The control for the test above: the same command with the environment as it is succeeds.
    result = manage("check")

    assert result.returncode == 0, result.stderr
    assert PREFIX not in result.stderr


def test_celery_follows_the_reliability_rules() -> None:
    conf = celery_app.conf

    assert conf.task_acks_late is True
    assert conf.task_reject_on_worker_lost is True
    assert conf.worker_prefetch_multiplier == 1
    assert conf.task_serializer == "json"
    assert list(conf.accept_content) == ["json"]
    assert conf.task_time_limit and conf.task_soft_time_limit
    assert 0 < conf.task_soft_time_limit < conf.task_time_limit
    visibility = conf.broker_transport_options["visibility_timeout"]
    assert visibility >= 1.5 * conf.task_time_limit
    assert conf.broker_url.startswith(("redis://", "rediss://", "redis+socket://"))


def test_the_time_limit_variable_drives_every_celery_limit() -> None:
    code = ("import json; from infraops.project.celery import app; c = app.conf; print(json.dumps("
            "[c.task_time_limit, c.task_soft_time_limit, "
            "c.broker_transport_options['visibility_timeout']]))")
    result = manage("shell", "-c", code, INFRAOPS_TASK_TIME_LIMIT="100")

    assert result.returncode == 0, result.stderr
    hard, soft, visibility = json.loads(result.stdout.strip().splitlines()[-1])
    assert hard == 100
    assert 0 < soft < 100
    assert visibility >= 150


def test_a_short_time_limit_alone_shortens_the_model_timeout_instead_of_refusing_to_start() -> None:
    # Only an explicit INFRAOPS_LLM_TIMEOUT past half the limit is refused (the table above).
    code = "from django.conf import settings; print(settings.LLM_TIMEOUT)"
    result = manage("shell", "-c", code, INFRAOPS_TASK_TIME_LIMIT="6")

    assert result.returncode == 0, result.stderr
    assert float(result.stdout.strip().splitlines()[-1]) == 3.0
    refused = manage("check", INFRAOPS_TASK_TIME_LIMIT="100", INFRAOPS_LLM_TIMEOUT="90")
    assert refused.returncode == 1
    assert "at most half of INFRAOPS_TASK_TIME_LIMIT" in refused.stderr


def test_the_channel_layer_is_redis_not_in_memory() -> None:
    backend = settings.CHANNEL_LAYERS["default"]["BACKEND"]
    layer = get_channel_layer()

    assert backend.startswith("channels_redis.")
    assert type(layer).__module__.startswith("channels_redis.")
    assert "InMemory" not in type(layer).__name__


def test_check_deploy_is_clean_with_production_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    # The suite sets it for Playwright's sync API; a deployment never does.
    monkeypatch.delenv("DJANGO_ALLOW_ASYNC_UNSAFE", raising=False)
    result = manage("check", "--deploy", "--fail-level", "WARNING",
                    SECRET_KEY="p" * 20 + "-production-secret-" + "q" * 30,
                    INFRAOPS_SECURE="true", DEBUG="false", ALLOWED_HOSTS="infraops.example.com")

    assert result.returncode == 0, result.stderr
    assert "System check identified no issues" in result.stdout


# Names Celery reads that are not among its documented settings, or ours that look like them.
NOT_CELERY_SETTINGS = {
    "CELERY_DB_REUSE_MAX": "read under this exact name by Celery's Django fixup",
    "TASK_TIME_LIMIT": "InfraOps's own value; CELERY_TASK_TIME_LIMIT and the others follow it",
}


def test_every_celery_setting_is_a_name_celery_reads() -> None:
    # A typo (CELERY_TASK_ACK_LATE) or a missing prefix (TASK_ACKS_LATE) is silently ignored by
    # config_from_object(namespace="CELERY") and leaves Celery's unsafe default in place.
    prefixed = {"CELERY_" + key.upper() for key in SETTING_KEYS}
    unprefixed = ({key.upper() for key in SETTING_KEYS} | set(_OLD_SETTING_KEYS)) - prefixed
    names = [name for name in dir(settings) if name not in NOT_CELERY_SETTINGS]

    assert [n for n in names if n.startswith("CELERY") and n not in prefixed] == []
    assert [n for n in names if n in unprefixed] == []
    assert settings.CELERY_TASK_TIME_LIMIT == settings.TASK_TIME_LIMIT


def test_a_running_worker_reports_the_reliability_settings(tmp_path: Path) -> None:
    """Reliability row C7: the configuration a started worker process holds, asked over the
    broker, not the one this test process imported."""
    queue = f"conf-check-{uuid.uuid4().hex[:8]}"  # consumes nothing anybody sends
    with started_workers(tmp_path / "data", tmp_path, settings.REDIS_URL) as workers:
        worker = workers.start([queue], concurrency=1, label="conf", ready_timeout=120)
        replies = wait_until(lambda: celery_app.control.inspect(
            destination=[worker.name], timeout=5).conf(with_defaults=True),
            timeout=90, interval=1, what="the worker's answer to inspect conf")

    conf = replies[worker.name]
    assert conf["task_acks_late"] is True
    assert conf["task_reject_on_worker_lost"] is True
    assert conf["worker_prefetch_multiplier"] == 1
    assert conf["task_serializer"] == "json" and list(conf["accept_content"]) == ["json"]
    assert conf["task_time_limit"] == settings.TASK_TIME_LIMIT
    assert 0 < conf["task_soft_time_limit"] < conf["task_time_limit"]
    assert conf["broker_transport_options"]["visibility_timeout"] >= 1.5 * conf["task_time_limit"]


def test_no_allowed_host_is_a_wildcard() -> None:
    # Reliability row W1: the websocket's own origin is checked against ALLOWED_HOSTS, so a
    # wildcard there would accept any page's socket.
    assert [host for host in settings.ALLOWED_HOSTS if host == "*" or host.startswith(".")] == []


@pytest.mark.parametrize(("url", "prefix"), [
    ("redis://127.0.0.1:6379/14", "infraops.db14"),
    ("redis://127.0.0.1:6379", "infraops.db0"),
    ("redis://:secret@redis.internal:6380/3", "infraops.db3"),
    ("unix:///run/redis.sock?db=5", "infraops.db5"),
    ("unix:///run/redis.sock", "infraops.db0"),
])
def test_the_channel_layer_prefix_is_one_per_redis_database(url: str, prefix: str) -> None:
    from infraops.project.settings import _channel_prefix

    assert _channel_prefix(url) == prefix


def test_live_updates_do_not_cross_between_redis_databases_of_one_server() -> None:
    """Redis pub/sub ignores the database number: the prefix is what keeps two installations
    (or two test sessions) on one server apart."""
    from asgiref.sync import async_to_sync
    from channels_redis.pubsub import RedisPubSubChannelLayer

    from infraops.project.settings import _channel_prefix

    base = settings.REDIS_URL.rsplit("/", 1)[0]
    mine, theirs = (RedisPubSubChannelLayer(hosts=[{"address": f"{base}/{n}"}],
                                            prefix=_channel_prefix(f"{base}/{n}"))
                    for n in (12, 13))

    async def scenario() -> tuple[object, object]:
        channel = await mine.new_channel()
        await mine.group_add("queue", channel)
        await theirs.group_send("queue", {"type": "from.another.installation"})
        await mine.group_send("queue", {"type": "from.this.one"})
        first = await mine.receive(channel)
        try:
            return first, await asyncio.wait_for(mine.receive(channel), timeout=0.5)
        except TimeoutError:
            return first, None
        finally:
            await mine.flush()
            await theirs.flush()

    first, second = async_to_sync(scenario)()
    assert first == {"type": "from.this.one"}
    assert second is None


def blob_storage(**overrides: str) -> dict[str, object]:
    result = manage("shell", "-c", "import json; from django.conf import settings; "
                    "print(json.dumps(settings.STORAGES['blobs']))", **overrides)
    assert result.returncode == 0, result.stderr
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))


def test_blobs_are_files_in_the_data_folder_unless_another_storage_is_named(
        tmp_path: Path) -> None:
    assert blob_storage(INFRAOPS_DATA=str(tmp_path)) == {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        "OPTIONS": {"location": str(tmp_path / "blobs")}}
    assert blob_storage(INFRAOPS_BLOB_STORAGE="storages.backends.s3.S3Storage",
                        INFRAOPS_BLOB_STORAGE_OPTIONS='{"bucket_name": "blobs"}') == {
        "BACKEND": "storages.backends.s3.S3Storage", "OPTIONS": {"bucket_name": "blobs"}}


def test_the_fleet_settings_default_to_one_host() -> None:
    assert (settings.WEB_URL, settings.WORKER_TOKEN, settings.BLOB_MAX_BYTES) == ("", "", 2 << 30)
