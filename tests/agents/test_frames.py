"""The run socket's frames are rendered once per process for every watcher alike
(agents.consumers.Frames): the same rows and state give the same frame without a render, and
anything new (a row, a state, the viewer's roles) makes a new one."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext

from agents.consumers import FRAMES, LATEST, RunConsumer
from agents.events import run_event
from agents.models import AgentRun
from infraops.models import Goal
from tests.agents.live_stream import frame_rows
from tests.factories import AgentRunFactory

pytestmark = pytest.mark.django_db


def consumer_of(user: User, run: AgentRun) -> RunConsumer:
    consumer = RunConsumer()
    consumer.scope = {"user": user}
    consumer.object_id = run.pk
    return consumer


@pytest.fixture
def run(example_goal: Goal, engineer: User) -> AgentRun:
    made = AgentRunFactory.create(goal=example_goal, started_by=engineer)
    for n in range(3):
        run_event(run_id=made.pk, kind="status", message=f"line {n}")
    return made


def test_watchers_of_one_run_share_a_frame_and_new_rows_make_a_new_one(
        run: AgentRun, viewer: User, engineer: User) -> None:
    FRAMES._frames.clear()
    LATEST._frames.clear()
    first, second = consumer_of(viewer, run), consumer_of(viewer, run)
    html, last = first.render_after(0)
    with CaptureQueriesContext(connection) as queries:
        again = second.render_after(0)
    assert again == (html, last) and last == 3
    assert len(queries) == 2  # the run's row and the viewer's role: no rows read, no render
    run_event(run_id=run.pk, kind="status", message="line 3")
    newer, upto = second.render_after(0)
    assert upto == 4 and [m for _, m in frame_rows(newer)][-1] == "line 3"
    # Another role sees other controls: a frame of its own.
    assert consumer_of(engineer, run).render_after(0)[0] != newer


def test_a_state_change_without_a_row_is_a_new_frame(run: AgentRun, viewer: User) -> None:
    FRAMES._frames.clear()
    LATEST._frames.clear()
    before, _ = consumer_of(viewer, run).render_after(0)
    AgentRun.objects.filter(pk=run.pk).update(status=AgentRun.Status.PAUSED)
    after, _ = consumer_of(viewer, run).render_after(0)
    assert 'class="badge paused"' in after and 'class="badge paused"' not in before


def test_nothing_new_reads_no_rows(run: AgentRun, viewer: User) -> None:
    with CaptureQueriesContext(connection) as queries:
        assert consumer_of(viewer, run).render_after(3) == ("", 3)
    assert len(queries) == 1


def test_a_watcher_woken_by_a_notice_takes_the_frame_another_rendered_without_a_query(
        run: AgentRun, viewer: User) -> None:
    FRAMES._frames.clear()
    LATEST._frames.clear()
    first, second = consumer_of(viewer, run), consumer_of(viewer, run)
    first.render_after(0)
    second.render_after(0)  # each has read its roles once
    run_event(run_id=run.pk, kind="status", message="line 3")
    first.notified = second.notified = 4  # what the run group's notice said
    rendered = first.render_after(3)
    with CaptureQueriesContext(connection) as queries:
        taken = second.render_after(3)
    assert taken == rendered and [m for _, m in frame_rows(taken[0])] == ["line 3"]
    assert len(queries) == 0
