"""infraops/settings.py: malformed environment values stop start-up with one sentence, and the
Celery and channel-layer settings follow ARCHITECTURE.md's reliability rules."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from channels.layers import get_channel_layer
from django.conf import settings

from infraops.celery import app as celery_app

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
    code = ("import json; from infraops.celery import app; c = app.conf; print(json.dumps("
            "[c.task_time_limit, c.task_soft_time_limit, "
            "c.broker_transport_options['visibility_timeout']]))")
    result = manage("shell", "-c", code, INFRAOPS_TASK_TIME_LIMIT="100")

    assert result.returncode == 0, result.stderr
    hard, soft, visibility = json.loads(result.stdout.strip().splitlines()[-1])
    assert hard == 100
    assert 0 < soft < 100
    assert visibility >= 150


def test_the_channel_layer_is_redis_not_in_memory() -> None:
    backend = settings.CHANNEL_LAYERS["default"]["BACKEND"]
    layer = get_channel_layer()

    assert backend.startswith("channels_redis.")
    assert type(layer).__module__.startswith("channels_redis.")
    assert "InMemory" not in type(layer).__name__


def test_check_deploy_is_clean_with_production_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    # The suite sets it for Playwright's sync API; a deployment never does.
    monkeypatch.delenv("DJANGO_ALLOW_ASYNC_UNSAFE", raising=False)
    result = manage("check", "--deploy", SECRET_KEY="p" * 20 + "-production-secret-" + "q" * 30,
                    INFRAOPS_SECURE="true", DEBUG="false", ALLOWED_HOSTS="infraops.example.com")

    assert result.returncode == 0, result.stderr
    assert "System check identified no issues" in result.stdout
