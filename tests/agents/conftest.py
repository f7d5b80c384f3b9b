"""Fixtures of the agent tests: a real local OpenAI-compatible server and an LLM goal."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command

from agents.scripted.demo import DemoModel
from agents.scripted.endpoint import OpenAIStub
from infraops.models import Goal, Target
from tests.factories import LATENCY_CRITERION, GoalFactory

API_KEY = "sk-test-live-key-0123456789"
SECRET = "db-password-sentinel-42"


@pytest.fixture
def stub(settings: Any) -> Iterator[OpenAIStub]:
    with OpenAIStub() as server:
        settings.OPENAI_BASE_URL = server.base_url
        settings.OPENAI_API_KEY = API_KEY
        settings.INFRAOPS_MODEL = "stub-model"
        settings.SECRET_KEY = SECRET + "-secret-key"
        yield server


@pytest.fixture
def llm_goal(example_target: Target, engineer: User) -> Callable[..., Goal]:
    def make(**boundary: Any) -> Goal:
        return GoalFactory.create(
            target=example_target, name="llm latency", probe="latency-bench",
            metric="latency_ms", direction="minimize", policy=Goal.Policy.LLM, owner=engineer,
            boundary={"editable_paths": "config/**", **boundary}, criteria=[LATENCY_CRITERION],
            snapshot_by=engineer)

    return make


@pytest.fixture
def demo(engineer: User) -> Target:
    """examples/demo-kernels loaded with its goals (one per case of docs/product.md)."""
    call_command("load_example", "demo-kernels", stdout=StringIO())
    return Target.objects.get(name="demo-kernels")


@pytest.fixture
def demo_model(settings: Any) -> Iterator[OpenAIStub]:
    """The demo's scripted model (agents/scripted/demo.py) as the run's endpoint."""
    with OpenAIStub(fallback=DemoModel()) as endpoint:
        settings.OPENAI_BASE_URL = endpoint.base_url
        settings.OPENAI_API_KEY = "demo"
        settings.INFRAOPS_MODEL = "infraops-demo"
        yield endpoint
