"""The review queue page (filters, my queue, keyset pages, bad addresses), the navigation's
count, the dashboard's link to the queue, and the socket that keeps the count live.

Changes are made with the ORM (no git): the queue reads only their rows.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from infraops.models import Goal, Target
from infraops.project.asgi import application
from reviews.live import queue_changed
from reviews.models import Change, ReviewerProfile
from reviews.views import queue as queue_view
from tests.conftest import members_of_new_target
from tests.factories import ChangeFactory, TargetFactory, UserFactory

Status = Change.Status
TIMEOUT = 5
ORIGIN = (b"origin", b"http://localhost")


def make_change(target: Target, title: str = "Tune batch_size", *,
                status: str = Status.PENDING_REVIEW, risk_classes: list[str] | None = None,
                goal: Goal | None = None, age: timedelta | None = None,
                gate: list[dict[str, Any]] | None = None, gate_passed: bool = False) -> Change:
    change = ChangeFactory.create(
        target=target, goal=goal, title=title, hypothesis="Bigger batches amortise.",
        status=status, risk_classes=risk_classes or [], gate=gate or [],
        gate_passed=gate_passed,
    )
    if age is not None:  # created_at is auto_now_add: set it afterwards
        Change.objects.filter(pk=change.pk).update(created_at=timezone.now() - age)
    return change


def titles(page: str) -> list[str]:
    """The change titles of the queue table, in order."""
    return re.findall(r'<td data-label="Change"><a href="/reviews/changes/\d+/">(.*?)</a>', page)


def next_link(page: str) -> str | None:
    found = re.search(r'<a rel="next" href="([^"]+)"', page)
    return found.group(1).replace("&amp;", "&") if found else None


def get(client: Client, query: str = "", **headers: str) -> str:
    response = client.get(f"/reviews/{query}", headers=headers)
    assert response.status_code == 200
    return response.content.decode()


@pytest.fixture
def classed_reviewer(reviewer: User) -> User:
    ReviewerProfile.objects.create(user=reviewer, risk_classes=["numerics", "concurrency"])
    return reviewer


@pytest.fixture
def reviewer_client(client: Client, reviewer: User) -> Client:
    client.force_login(reviewer)
    return client


# --- filters ---------------------------------------------------------------------------

@pytest.fixture
def mixed(example_target: Target, example_goal: Goal) -> dict[str, Change]:
    other = members_of_new_target(
        TargetFactory.create(name="other-serving"))
    return {
        "numerics": make_change(example_target, "fp16 accumulate", risk_classes=["numerics"],
                                goal=example_goal),
        "production": make_change(example_target, "Raise max_queue",
                                  risk_classes=["production"], age=timedelta(days=3)),
        "unclassed": make_change(other, "Rename a helper", age=timedelta(days=10)),
        "merged": make_change(example_target, "Old merged tweak", status=Status.MERGED,
                              risk_classes=["numerics"], age=timedelta(days=40)),
    }


@pytest.mark.parametrize(("query", "expected"), [
    ("", ["fp16 accumulate", "Raise max_queue", "Rename a helper"]),
    ("?status=merged", ["Old merged tweak"]),
    ("?status=any", ["fp16 accumulate", "Raise max_queue", "Rename a helper", "Old merged tweak"]),
    ("?class=numerics", ["fp16 accumulate"]),
    ("?class=production", ["Raise max_queue"]),
    ("?class=none", ["Rename a helper"]),
    ("?class=concurrency", []),
    ("?age=newer-1d", ["fp16 accumulate"]),
    ("?age=older-1d", ["Raise max_queue", "Rename a helper"]),
    ("?age=older-7d", ["Rename a helper"]),
    ("?status=any&age=older-30d", ["Old merged tweak"]),
    ("?q=MAX_QUEUE", ["Raise max_queue"]),
    ("?q=nothing-like-it", []),
    ("?status=any&class=numerics&q=tweak", ["Old merged tweak"]),
], ids=lambda v: v if isinstance(v, str) else None)
def test_each_filter_narrows_the_list(reviewer_client: Client, mixed: dict[str, Change],
                                      query: str, expected: list[str]) -> None:
    assert titles(get(reviewer_client, query)) == expected


def test_the_target_and_goal_filters_narrow_the_list(
    reviewer_client: Client, mixed: dict[str, Change], example_goal: Goal
) -> None:
    other = mixed["unclassed"].target

    assert titles(get(reviewer_client, f"?target={other.pk}")) == ["Rename a helper"]
    assert titles(get(reviewer_client, f"?goal={example_goal.pk}")) == ["fp16 accumulate"]
    assert titles(get(reviewer_client, f"?goal={example_goal.pk}&target={other.pk}")) == []
    assert titles(get(reviewer_client, f"?target={other.pk + 1000}")) == []  # none such


def test_the_target_and_goal_selects_show_the_chosen_one(
    reviewer_client: Client, mixed: dict[str, Change], example_goal: Goal
) -> None:
    page = get(reviewer_client, f"?goal={example_goal.pk}")

    assert f'<option value="{example_goal.pk}" selected>tiny-serving: latency</option>' in page
    assert '<option value="" selected>any target</option>' in page


def test_an_empty_list_says_why(reviewer_client: Client, example_target: Target) -> None:
    assert "Nothing awaits review." in get(reviewer_client)
    assert "No change matches these filters." in get(reviewer_client, "?q=zzz")


def test_a_row_shows_gate_status_age_and_author(reviewer_client: Client,
                                                example_target: Target) -> None:
    make_change(example_target, "Two failing", age=timedelta(hours=3, minutes=5), gate=[
        {"name": "criteria", "passed": False, "detail": ""},
        {"name": "diff policy", "passed": False, "detail": ""},
        {"name": "risk", "passed": True, "detail": ""}])
    make_change(example_target, "All green", gate=[{"name": "criteria", "passed": True}],
                gate_passed=True)

    page = get(reviewer_client)

    assert 'title="criteria, diff policy">2 checks failing</span>' in page
    assert ">gate passed</span>" in page
    assert re.search(r'<time datetime="[^"]+" title="\d{4}-\d\d-\d\d \d\d:\d\d UTC">3 h ago</time>',
                     page)
    assert '<span class="badge pending_review">awaiting review</span>' in page
    assert '<td data-label="From">run 1</td>' in page


# --- my queue --------------------------------------------------------------------------

def test_my_queue_holds_only_my_classes_and_all_changes_holds_every_class(
    client: Client, classed_reviewer: User, example_target: Target
) -> None:
    make_change(example_target, "numerics one", risk_classes=["numerics"])
    make_change(example_target, "concurrency and production",
                risk_classes=["concurrency", "production"])
    make_change(example_target, "production only", risk_classes=["production"])
    make_change(example_target, "no class")
    client.force_login(classed_reviewer)

    mine = get(client)

    assert titles(mine) == ["concurrency and production", "numerics one"]
    assert 'value="mine" id="id_scope_0" checked' in mine
    assert titles(get(client, "?scope=all")) == [
        "no class", "production only", "concurrency and production", "numerics one"]


def test_a_generalist_has_every_class_in_my_queue(reviewer_client: Client,
                                                  example_target: Target) -> None:
    make_change(example_target, "numerics one", risk_classes=["numerics"])
    make_change(example_target, "no class")

    page = get(reviewer_client)

    assert titles(page) == ["no class", "numerics one"]
    assert "No risk class is assigned to me" in page


# --- keyset pages ----------------------------------------------------------------------

def test_keyset_pages_return_every_change_exactly_once(
    reviewer_client: Client, example_target: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(queue_view, "PAGE_SIZE", 10)
    made = [make_change(example_target, f"change {n:02}") for n in range(25)]
    # Ties on created_at across a page boundary: the id breaks them.
    same = timezone.now() - timedelta(hours=1)
    Change.objects.filter(pk__in=[c.pk for c in made[5:20]]).update(created_at=same)

    seen: list[str] = []
    query: str | None = "/reviews/"
    pages = 0
    while query:
        page = reviewer_client.get(query).content.decode()
        seen += titles(page)
        query = next_link(page)
        pages += 1

    assert pages == 3
    assert sorted(seen) == sorted(c.title for c in made)
    assert len(seen) == len(set(seen)) == 25


def test_the_next_page_keeps_the_filters(
    reviewer_client: Client, example_target: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(queue_view, "PAGE_SIZE", 2)
    for n in range(3):
        make_change(example_target, f"kv cache {n}")
        make_change(example_target, f"batching {n}")

    first = get(reviewer_client, "?q=kv")
    link = next_link(first)
    assert link is not None and "q=kv" in link and "after=" in link
    second = reviewer_client.get(link).content.decode()

    assert titles(first) == ["kv cache 2", "kv cache 1"]
    assert titles(second) == ["kv cache 0"]
    assert next_link(second) is None
    assert 'href="/reviews/?q=kv"' in second  # back to the first page


def test_a_cursor_round_trips() -> None:
    change = Change(pk=42, created_at=datetime(2025, 3, 1, 12, 30, 5, 123456, tzinfo=UTC))

    text = queue_view.format_cursor(change)

    assert text == "2025-03-01T12:30:05.123456Z_42"
    assert queue_view.parse_cursor(text) == (change.created_at, 42)


@pytest.mark.parametrize("text", [
    "", "x", "2025-03-01T12:30:05_42", "2025-03-01T12:30:05Z_", "2025-03-01T12:30:05Z_x",
    "2025-03-01T12:30:05Z_0", "2025-03-01T12:30:05Z_99999999999999999999", "_42",
])
def test_a_malformed_cursor_reads_as_none(text: str) -> None:
    assert queue_view.parse_cursor(text) is None


@pytest.mark.parametrize(("seconds", "label"), [
    (0, "just now"), (59, "just now"), (60, "1 min ago"), (3 * 3600 + 300, "3 h ago"),
    (86400 * 2, "2 d ago"), (86400 * 400, "1 y ago"), (-30, "just now"),
])
def test_ages_read_in_one_unit(seconds: int, label: str) -> None:
    now = datetime(2025, 3, 1, tzinfo=UTC)

    assert queue_view.age_label(now - timedelta(seconds=seconds), now) == label


# --- malformed parameters --------------------------------------------------------------

@pytest.mark.parametrize(("query", "message"), [
    ("?after=garbage", "page: the page link is not one this page made."),
    ("?after=2025-01-01T00:00:00Z_99999999999999999999999", "page: the page link"),
    ("?status=bogus", "status: “bogus” is not a status."),
    ("?target=abc", "target: a target is given by its number."),
    ("?target=99999999999999999999", "target: a target is given by its number."),
    ("?target=-3", "target: a target is given by its number."),
    ("?goal=1.5", "goal: a goal is given by its number."),
    ("?class=maths", "class: “maths” is not a risk class."),
    ("?age=yesterday", "age: “yesterday” is not an age."),
    ("?scope=everything", "scope: “everything” is not a view."),
    ("?q=a%00b", "search: Null characters are not allowed."),
    (f"?q={'x' * 201}", "search: a search is at most 200 characters."),
], ids=lambda v: v[:40])
def test_a_malformed_parameter_is_named_and_ignored(
    reviewer_client: Client, mixed: dict[str, Change], query: str, message: str
) -> None:
    page = get(reviewer_client, query)

    assert message in page
    assert 'role="alert"' in page
    # The unfiltered first page of my queue
    assert titles(page) == ["fp16 accumulate", "Raise max_queue", "Rename a helper"]


def test_a_malformed_parameter_keeps_the_valid_ones_and_leaves_the_links(
    reviewer_client: Client, mixed: dict[str, Change]
) -> None:
    page = get(reviewer_client, "?status=bogus&class=production&after=nope")

    assert titles(page) == ["Raise max_queue"]
    assert "status: “bogus” is not a status." in page
    assert "status=bogus" not in page


def test_the_fragment_names_the_malformed_parameter_too(reviewer_client: Client,
                                                        mixed: dict[str, Change]) -> None:
    page = get(reviewer_client, "?target=abc", HX_Request="true", HX_Target="queue-table")

    assert page.lstrip().startswith('<div id="queue-table">')
    assert "target: a target is given by its number." in page


# --- access ----------------------------------------------------------------------------

def test_a_viewer_sees_the_queue(client: Client, viewer: User, mixed: dict[str, Change]) -> None:
    client.force_login(viewer)

    page = get(client)

    assert titles(page) == ["fp16 accumulate", "Raise max_queue", "Rename a helper"]


@pytest.mark.django_db
def test_an_anonymous_visitor_is_sent_to_login(client: Client) -> None:
    response = client.get("/reviews/?class=numerics")

    assert response.status_code == 302
    assert response["Location"] == "/accounts/login/?next=/reviews/%3Fclass%3Dnumerics"


@pytest.mark.django_db
def test_a_user_without_a_role_is_forbidden(client: Client) -> None:
    client.force_login(UserFactory.create(username="nora", roles=[]))

    assert client.get("/reviews/").status_code == 403


def orm_queue(user: User, filters: dict[str, Any]) -> list[int]:
    """The queue as the ORM says it: the reference queue_view.queue_page's statement keeps to."""
    from infraops.access import scoped
    from reviews.live import reviewer_classes

    changes = scoped(Change.objects.all(), user)
    if filters["status"] != queue_view.ANY_STATUS:
        changes = changes.filter(status=filters["status"])
    if filters["scope"] == "mine" and (classes := reviewer_classes(user)):
        changes = changes.for_classes(classes)
    if filters["class"] == queue_view.NO_CLASS:
        changes = changes.filter(risk_classes=[])
    elif filters["class"]:
        changes = changes.filter(risk_classes__contains=[filters["class"]])
    for name in ("target", "goal"):
        if filters[name] is not None:
            changes = changes.filter(**{f"{name}_id": filters[name]})
    if filters["age"]:
        edge = timezone.now() - queue_view.AGES[filters["age"]][1]
        lookup = "created_at__gte" if filters["age"].startswith("newer") else "created_at__lt"
        changes = changes.filter(**{lookup: edge})
    if filters["q"]:
        changes = changes.filter(title__icontains=filters["q"])
    if filters["after"] is not None:
        when, pk = filters["after"]
        changes = changes.filter(created_at__lt=when) | changes.filter(created_at=when, id__lt=pk)
    return list(changes.order_by("-created_at", "-id").values_list("pk", flat=True)
                [:queue_view.PAGE_SIZE])


def test_the_queues_statement_selects_what_the_orm_does_for_every_filter_and_user(
    mixed: dict[str, Change], classed_reviewer: User, viewer: User, example_goal: Goal
) -> None:
    import random

    make_change(mixed["numerics"].target, "100% of 50_50 tiles", risk_classes=["concurrency"])
    superuser = UserFactory.create(username="root-reader", is_superuser=True)
    outsider = UserFactory.create(username="no-member")
    oldest = Change.objects.order_by("created_at").first()
    assert oldest is not None
    choices: dict[str, list[Any]] = {
        "scope": ["mine", "all"], "status": [queue_view.ANY_STATUS, *Status.values],
        "class": ["", "none", "numerics", "production", "concurrency"],
        "target": [None, mixed["numerics"].target_id, mixed["unclassed"].target_id, 999_999],
        "goal": [None, example_goal.pk],
        "age": ["", *queue_view.AGES], "q": ["", "MAX_queue", "%", "_50", "tweak", "\\"],
        "after": [None, (timezone.now(), 2**62), (oldest.created_at, oldest.pk + 1)],
    }
    draw, selected = random.Random(27), 0
    for _ in range(200):  # most filters left out in each draw, so that most draws select rows
        filters = {name: draw.choice(values[1:]) if draw.random() < 0.3 else values[0]
                   for name, values in choices.items()}
        for user in (superuser, classed_reviewer, viewer, outsider):
            page, _ = queue_view.queue_page(user, filters)
            expected = orm_queue(user, filters)
            assert [c.pk for c in page] == expected, (user.username, filters)
            selected += bool(expected)
    assert selected > 200  # of 800: the draws select rows, so the comparison can fail


# --- full page or fragment -------------------------------------------------------------

def test_the_dashboards_link_opens_the_whole_queue_page(reviewer_client: Client,
                                                        mixed: dict[str, Change]) -> None:
    dashboard = reviewer_client.get("/").content.decode()
    link = re.search(r'<a href="([^"]+)" hx-boost="true"><span id="awaiting-review-line">'
                     r'3 changes awaiting review</span></a>', dashboard)
    assert link is not None

    # What htmx sends for a boosted link: it swaps the page's <body>.
    boosted = get(reviewer_client, link.group(1).removeprefix("/reviews/"), HX_Request="true",
                  HX_Boosted="true", HX_Current_URL="http://testserver/")

    assert "<html" in boosted and "<h1>Review queue</h1>" in boosted
    assert '<form class="filters card"' in boosted
    assert titles(boosted) == ["fp16 accumulate", "Raise max_queue", "Rename a helper"]


def test_a_history_restore_gets_the_whole_page(reviewer_client: Client,
                                               mixed: dict[str, Change]) -> None:
    page = get(reviewer_client, "?class=none", HX_Request="true",
               HX_History_Restore_Request="true")

    assert "<html" in page and titles(page) == ["Rename a helper"]


def test_a_swap_of_the_table_gets_only_the_table(reviewer_client: Client,
                                                 mixed: dict[str, Change]) -> None:
    page = get(reviewer_client, "?class=none", HX_Request="true", HX_Target="queue-table")

    assert page.lstrip().startswith('<div id="queue-table">')
    assert "<html" not in page and "<form" not in page
    assert titles(page) == ["Rename a helper"]


def test_the_filter_form_swaps_the_table_and_pushes_its_address(reviewer_client: Client) -> None:
    page = get(reviewer_client)

    form = re.search(r'<form class="filters card"[^>]*>', page)
    assert form is not None
    assert 'method="get"' in form.group(0) and 'hx-get="/reviews/"' in form.group(0)
    assert 'hx-target="#queue-table"' in form.group(0) and 'hx-push-url="true"' in form.group(0)


# --- queries ---------------------------------------------------------------------------

def test_the_rows_cost_one_query_however_many(
    client: Client, classed_reviewer: User, example_target: Target, example_goal: Goal,
    django_assert_num_queries: Any
) -> None:
    for n in range(30):
        make_change(example_target, f"change {n}", risk_classes=["numerics"], goal=example_goal,
                    gate=[{"name": "criteria", "passed": n % 2 == 0}])
    client.force_login(classed_reviewer)
    get(client)  # the session's first request updates nothing afterwards, but warms caches

    # session, the user with their roles and reviewer profile (reviews.backends), rows
    with django_assert_num_queries(3):
        get(client, "?class=numerics", HX_Request="true", HX_Target="queue-table")
    # ... and for the page: the target and goal choices and the nav count
    with django_assert_num_queries(6):
        page = get(client, "?class=numerics")
    assert len(titles(page)) == queue_view.PAGE_SIZE


# --- the navigation's count ------------------------------------------------------------

def test_the_nav_counts_what_awaits_a_reviewer_with_classes(
    client: Client, classed_reviewer: User, mixed: dict[str, Change]
) -> None:
    make_change(mixed["numerics"].target, "lock-free queue", risk_classes=["concurrency"])
    make_change(mixed["numerics"].target, "approved numerics", risk_classes=["numerics"],
                status=Status.APPROVED)
    client.force_login(classed_reviewer)

    page = client.get("/").content.decode()

    assert '<span id="nav-queue-count" class="count" title="awaiting review for me">(2)</span>' \
        in page


def test_the_dashboard_line_and_the_nav_count_agree_for_a_reviewer_with_classes(
    client: Client, classed_reviewer: User, mixed: dict[str, Change]
) -> None:
    # issue 27: the dashboard counted every class while the nav counted the reviewer's
    client.force_login(classed_reviewer)

    page = client.get("/").content.decode()

    assert 'title="awaiting review for me">(1)</span>' in page
    assert '<span id="awaiting-review-line">1 change awaiting review</span>' in page
    assert 'ws-connect="/ws/reviews/?page=dashboard"' in page  # the line is kept live


def test_the_nav_counts_every_waiting_change_for_anyone_else(
    client: Client, viewer: User, mixed: dict[str, Change]
) -> None:
    client.force_login(viewer)

    assert 'title="awaiting review for me">(3)</span>' in client.get("/").content.decode()


# --- the live count --------------------------------------------------------------------

def run_async(scenario: Callable[[], Awaitable[Any]]) -> Any:
    """Run the scenario on a thread of its own: a browser test earlier in the session leaves
    Playwright's event loop running in the main thread, where async_to_sync refuses to run."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(async_to_sync(scenario)).result(timeout=120)


def session_headers(user: User | None) -> list[tuple[bytes, bytes]]:
    headers = [ORIGIN]
    if user is not None:
        client = Client()
        client.force_login(user)
        headers.append((b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode()))
    return headers


live = pytest.mark.django_db(transaction=True)


def message_after(user: User, path: str, action: Callable[[], None]) -> str:
    """What the socket at `path` sends `user` after `action`, once its first message is in."""
    headers = session_headers(user)

    async def scenario() -> str:
        communicator = WebsocketCommunicator(application, path, headers=headers)
        assert (await communicator.connect(timeout=TIMEOUT))[0]
        await communicator.receive_from(timeout=TIMEOUT)
        await sync_to_async(action)()
        html = await communicator.receive_from(timeout=TIMEOUT)
        await communicator.disconnect()
        return str(html)

    return str(run_async(scenario))


@live
def test_an_anonymous_socket_is_refused(close_thread_connections: None) -> None:
    headers = session_headers(None)

    async def scenario() -> tuple[bool, Any]:
        communicator = WebsocketCommunicator(application, "/ws/reviews/", headers=headers)
        return await communicator.connect(timeout=TIMEOUT)

    assert run_async(scenario) == (False, 4403)


@live
def test_the_socket_sends_the_new_count_after_queue_changed(
    close_thread_connections: None, classed_reviewer: User, example_target: Target
) -> None:
    make_change(example_target, "numerics one", risk_classes=["numerics"])
    make_change(example_target, "production one", risk_classes=["production"])

    def submit() -> None:
        make_change(example_target, "concurrency one", risk_classes=["concurrency"])
        queue_changed()  # no transaction open: on_commit sends at once

    headers = session_headers(classed_reviewer)

    async def scenario() -> tuple[str, str, bool]:
        communicator = WebsocketCommunicator(application, "/ws/reviews/", headers=headers)
        assert (await communicator.connect(timeout=TIMEOUT))[0]
        on_connect = await communicator.receive_from(timeout=TIMEOUT)
        await sync_to_async(submit)()
        after = await communicator.receive_from(timeout=TIMEOUT)
        nothing_more = await communicator.receive_nothing(timeout=0.5)
        await communicator.disconnect()
        return str(on_connect), str(after), nothing_more

    on_connect, after, nothing_more = run_async(scenario)

    assert on_connect == ('<span id="nav-queue-count" class="count" '
                          'title="awaiting review for me">(1)</span>')
    assert '<span id="nav-queue-count"' in after and ">(2)</span>" in after
    assert "queue-stale" not in after  # this socket is not on the queue page
    assert nothing_more


@live
def test_on_the_dashboard_the_socket_keeps_its_line_live_and_equal_to_the_nav(
    close_thread_connections: None, viewer: User, example_target: Target
) -> None:
    # issue 27: the dashboard's "0 changes awaiting review" stayed 0 while the nav said (2)
    def submit() -> None:
        make_change(example_target, "one more", risk_classes=["numerics"])
        queue_changed()

    html = message_after(viewer, "/ws/reviews/?page=dashboard", submit)

    waiting = Change.objects.filter(status=Status.PENDING_REVIEW).count()
    assert f'title="awaiting review for me">({waiting})</span>' in html
    assert (f'<span id="awaiting-review-line">{waiting} change{"s" * (waiting != 1)} '
            "awaiting review</span>") in html


@live
def test_on_the_queue_page_the_socket_also_shows_the_refresh_banner(
    close_thread_connections: None, viewer: User, example_target: Target
) -> None:
    def decide() -> None:
        Change.objects.filter(title="waiting").update(status=Status.REJECTED)
        queue_changed()

    make_change(example_target, "waiting")
    html = message_after(viewer, "/ws/reviews/?page=queue", decide)

    assert ">(0)</span>" in html
    assert '<p id="queue-stale" class="message" role="status">' in html
    assert "hidden" not in html


@live
def test_a_notice_inside_a_rolled_back_transaction_sends_nothing(
    close_thread_connections: None, viewer: User
) -> None:
    from django.db import transaction

    def roll_back() -> None:
        with pytest.raises(RuntimeError), transaction.atomic():
            queue_changed()
            raise RuntimeError

    headers = session_headers(viewer)

    async def scenario() -> bool:
        communicator = WebsocketCommunicator(application, "/ws/reviews/", headers=headers)
        assert (await communicator.connect(timeout=TIMEOUT))[0]
        await communicator.receive_from(timeout=TIMEOUT)
        await sync_to_async(roll_back)()
        silent = await communicator.receive_nothing(timeout=0.5)
        await communicator.disconnect()
        return silent

    assert run_async(scenario)
