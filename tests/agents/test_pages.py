"""What the dashboard and the target page tell about runs: when each started, how long it took
or has taken, its progress against the budget, its result; a target's boundary and runs; the
run already active on a goal before a second one starts."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.template import Context, Template
from django.test import Client
from django.utils import timezone

from agents.models import AgentRun
from infraops.models import Goal
from tests.factories import AgentRunFactory

pytestmark = [pytest.mark.django_db]


def cells(page: str, label: str) -> list[str]:
    return [re.sub(r"<[^>]+>", "", c).strip()
            for c in re.findall(rf'<td data-label="{label}">(.*?)</td>', page, re.S)]


def test_the_dashboard_says_when_how_long_how_far_and_how_it_ended(
        client: Client, engineer: User, example_goal: Goal) -> None:
    started = timezone.now() - timedelta(minutes=7, seconds=5)
    done = AgentRunFactory.create(goal=example_goal, started_by=engineer,
                                  status=AgentRun.Status.FINISHED, step_count=12,
                                  stop_reason="finished: nothing beat the base",
                                  finished_at=started + timedelta(minutes=3, seconds=12))
    AgentRun.objects.filter(pk=done.pk).update(created_at=started)
    running = AgentRunFactory.create(goal=example_goal, started_by=engineer,
                                     status=AgentRun.Status.RUNNING, step_count=5)
    AgentRun.objects.filter(pk=running.pk).update(created_at=timezone.now() - timedelta(hours=2))
    client.force_login(engineer)

    page = client.get("/").content.decode()

    assert re.search(r'<td data-label="Started"><time datetime="[^"]+Z" data-local="datetime">'
                     r"\d{4}-\d\d-\d\d \d\d:\d\d UTC</time></td>", page)
    took, so_far = cells(page, "Duration")  # the newest first: the finished one
    assert re.fullmatch(r"2 h \d+ min so far", so_far) and took == "3 min 12 s"
    assert cells(page, "Steps") == ["12 of 50", "5 of 50"]
    assert '<progress value="5" max="50"' in page
    assert cells(page, "Result") == ["finished: nothing beat the base", "—"]


def test_the_target_page_shows_the_boundary_and_the_runs(
        client: Client, engineer: User, example_goal: Goal) -> None:
    run = AgentRunFactory.create(goal=example_goal, started_by=engineer,
                                 status=AgentRun.Status.FAILED,
                                 stop_reason="failed: the probe crashed",
                                 finished_at=timezone.now())
    client.force_login(engineer)

    page = client.get(f"/targets/{example_goal.target.name}/").content.decode()

    assert "Boundary: what the agent may touch and spend" in page
    assert "<dt>May edit</dt><dd><code>config/**</code>" in page
    assert "8 experiments" in page
    assert f'<a href="/runs/{run.pk}/">run {run.pk}</a>' in page
    assert "failed: the probe crashed" in page
    assert "Start a run</button>" in page and "is running on this goal" not in page


def test_a_second_run_on_a_goal_is_started_knowingly(
        client: Client, engineer: User, example_goal: Goal) -> None:
    active = AgentRunFactory.create(goal=example_goal, started_by=engineer,
                                    status=AgentRun.Status.PAUSED)
    client.force_login(engineer)

    page = client.get(f"/targets/{example_goal.target.name}/").content.decode()

    assert f"Run {active.pk}</a> is paused on this goal" in page
    assert "Start another run</button>" in page


def test_the_duration_reads_as_people_say_it() -> None:
    start = timezone.now()
    cases = {timedelta(seconds=9): "9 s", timedelta(minutes=3, seconds=12): "3 min 12 s",
             timedelta(hours=2, minutes=5, seconds=59): "2 h 5 min",
             timedelta(seconds=-4): "0 s"}
    for span, said in cases.items():
        out = Template("{% load local_time %}{{ a|duration:b }}").render(
            Context({"a": start, "b": start + span}))
        assert out == said, span
    assert Template("{% load local_time %}{{ a|duration }}").render(Context({"a": None})) == ""


def test_every_colour_follows_the_scheme() -> None:
    """Dark by the system's choice: every colour outside the two :root blocks is a variable,
    so the dark block changes them all."""
    styles = (Path(settings.BASE_DIR) / "static" / "css" / "infraops.css").read_text()
    assert "@media (prefers-color-scheme: dark)" in styles
    body = [line for line in styles.splitlines() if not line.lstrip().startswith(":root")]
    assert [line for line in body if re.search(r"#[0-9a-fA-F]{3,6}\b", line)] == []
    light, dark = re.findall(r":root \{([^}]*)\}", styles)
    names = set(re.findall(r"(--[\w-]+):", light))
    assert names - {"--bg"} <= set(re.findall(r"(--[\w-]+):", dark)) | {"--bg"}


def test_starting_a_second_run_says_which_one_is_active(
        client: Client, engineer: User, example_goal: Goal,
        monkeypatch: pytest.MonkeyPatch) -> None:
    active = AgentRunFactory.create(goal=example_goal, started_by=engineer,
                                    status=AgentRun.Status.RUNNING)
    second = AgentRunFactory.create(goal=example_goal, started_by=engineer,
                                    status=AgentRun.Status.RUNNING)
    # The view's part: what it says around the start (the start itself: tests of services).
    monkeypatch.setattr("agents.views.services.run_start", lambda **_: second)
    client.force_login(engineer)

    response = client.post(f"/goals/{example_goal.pk}/runs/", follow=True)

    assert response.redirect_chain == [(f"/runs/{second.pk}/", 302)]
    assert (f"Run {active.pk} is also active on this goal: the two compete for the workers"
            in response.content.decode())
