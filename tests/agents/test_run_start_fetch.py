"""Starting a run from a page runs no git in the request (issue 28): the run pins what the
target's worker last fetched, and its first step, in a worker, fetches the upstream and moves
the base to the tip when the base branch moved. A fetch that fails there leaves the run on its
pinned base, saying so."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from agents.models import AgentRun
from agents.services import FETCH_FIRST, run_start, run_step
from infraops import gitops
from infraops.models import Goal, Target
from tests.infraops.test_upstream import commit_on

pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")


def no_git_here(*args: Any, **kwargs: Any) -> None:
    raise AssertionError("git ran in the request")


def first_step(run: AgentRun, capture: Any) -> AgentRun:
    with capture(execute=False):
        run_step(run_id=run.pk, number=0)
    run.refresh_from_db()
    return run


def test_the_start_button_fetches_nothing_in_its_request(
    client: Client, engineer: User, example_goal: Goal, monkeypatch: pytest.MonkeyPatch,
    django_capture_on_commit_callbacks: Any,
) -> None:
    target = example_goal.target
    monkeypatch.setattr(gitops, "repo_fetch", no_git_here)
    monkeypatch.setattr(gitops, "merge", no_git_here)
    client.force_login(engineer)

    with django_capture_on_commit_callbacks(execute=False) as sent:
        response = client.post(f"/goals/{example_goal.pk}/runs/")

    run = AgentRun.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/runs/{run.pk}/"
    assert run.base_commit == target.manifest_commit and run.state == {FETCH_FIRST: True}
    assert [c.__qualname__ for c in sent if "_enqueue_step" in c.__qualname__]  # step one


def test_step_one_fetches_and_starts_from_the_tip_the_upstream_moved_to(
    example_goal: Goal, engineer: User, tmp_path: Path,
    django_capture_on_commit_callbacks: Any,
) -> None:
    target = example_goal.target
    with django_capture_on_commit_callbacks(execute=False):
        run = run_start(goal=example_goal, user=engineer, fetch=False)
    pinned = run.base_commit
    upstream = commit_on(Path(target.repo_url), "main", tmp_path / "w",
                         {"UPSTREAM.md": "pushed after the target was fetched\n"})

    run = first_step(run, django_capture_on_commit_callbacks)

    assert run.base_commit == upstream != pinned
    assert FETCH_FIRST not in run.state
    assert run.events.filter(message__contains=f"starts from its tip {upstream[:10]} (was "
                                               f"{pinned[:10]})").exists()
    assert run.step_count == 1  # and the step itself was taken, from the new base
    experiment = run.experiments.first()
    if experiment is not None:  # the search may draw the base configuration first
        assert experiment.baseline_commit == upstream


def test_step_one_goes_on_from_the_pinned_base_when_the_fetch_fails(
    example_goal: Goal, engineer: User, django_capture_on_commit_callbacks: Any,
) -> None:
    target: Target = example_goal.target
    with django_capture_on_commit_callbacks(execute=False):
        run = run_start(goal=example_goal, user=engineer, fetch=False)
    shutil.rmtree(target.repo_url)  # the upstream is gone

    run = first_step(run, django_capture_on_commit_callbacks)

    assert run.base_commit == target.manifest_commit and FETCH_FIRST not in run.state
    assert run.events.filter(message__startswith="Fetching the upstream failed").exists()
    assert run.status == AgentRun.Status.RUNNING and run.step_count == 1


def test_a_run_started_with_a_fetch_has_nothing_left_to_fetch(
    example_goal: Goal, engineer: User, django_capture_on_commit_callbacks: Any,
) -> None:
    with django_capture_on_commit_callbacks(execute=False):
        run = run_start(goal=example_goal, user=engineer)
    assert FETCH_FIRST not in run.state

    run = first_step(run, django_capture_on_commit_callbacks)

    assert not run.events.filter(message__contains="Fetch").exists()
