"""The hot reads written as statements (infraops.reads, the session store, the user backend,
the review count, the role check) answer exactly what the ORM answers."""

from __future__ import annotations

import itertools
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import AnonymousUser, User
from django.contrib.sessions.models import Session
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agents.models import AgentRun, Hypothesis, RunMessage
from infraops.access import scoped, target_roles, visible_target_ids
from infraops.models import Goal, Target, TargetMembership
from infraops.project.sessions import SessionStore
from infraops.reads import JoinedRead, give_related
from infraops.services.targets import target_register
from reviews.backends import PROFILE_COLUMNS, USER_COLUMNS, OneQueryUserBackend
from reviews.live import awaiting_for_classes, count_awaiting
from reviews.models import RISK_CLASSES, Change, ReviewerProfile
from tests.conftest import make_origin, member
from tests.factories import AgentRunFactory, ChangeFactory, UserFactory

pytestmark = pytest.mark.django_db

RUN_READ = JoinedRead(AgentRun, "goal_version__goal__target", "target", "started_by")


def _run(goal: Goal, user: User, **fields: object) -> AgentRun:
    return AgentRunFactory.create(goal_version=goal.versions.get(), started_by=user,
                                  policy="tuner", base_commit="a" * 40,
                                  manifest_sha256="b" * 64, **fields)


def _values(instance: object) -> dict[str, object]:
    return {f.attname: getattr(instance, f.attname)
            for f in type(instance)._meta.concrete_fields}  # type: ignore[attr-defined]


def test_a_joined_read_gives_what_select_related_gives(example_goal: Goal,
                                                       engineer: User) -> None:
    run = _run(example_goal, engineer, state={"best": [1, 2]}, cost_usd="1.2345")
    expected = AgentRun.objects.select_related(
        "goal_version__goal__target", "target", "started_by").get(pk=run.pk)
    read = RUN_READ.get(run.pk)
    assert read is not None
    with CaptureQueriesContext(connection) as queries:
        pairs = [(read, expected), (read.goal_version, expected.goal_version),
                 (read.goal_version.goal, expected.goal_version.goal),
                 (read.goal_version.goal.target, expected.goal_version.goal.target),
                 (read.target, expected.target), (read.started_by, expected.started_by)]
    assert len(queries) == 0, "every relation is cached on its parent"
    for mine, orms in pairs:
        assert _values(mine) == _values(orms)
    assert read.state == {"best": [1, 2]} and str(read.cost_usd) == "1.2345"


def test_a_missing_row_reads_as_none_and_a_huge_key_too(db: None) -> None:
    assert RUN_READ.get(123456) is None
    assert RUN_READ.get(10**20) is None


def test_a_nullable_relation_reads_as_none_where_the_row_has_none(
        example_goal: Goal, engineer: User) -> None:
    run = _run(example_goal, engineer)
    with_author = Hypothesis.objects.create(run=run, title="mine", author=engineer)
    without = Hypothesis.objects.create(run=run, title="the agent's")
    read = JoinedRead(Hypothesis, "author", where="t0.run_id = %s",
                      order_by="t0.created_at, t0.id")
    rows = read.all(run.pk)
    assert [h.pk for h in rows] == [with_author.pk, without.pk]
    with CaptureQueriesContext(connection) as queries:
        assert rows[0].author == engineer and rows[1].author is None
    assert len(queries) == 0


def test_the_condition_order_and_limit_are_the_reads(example_goal: Goal,
                                                     engineer: User) -> None:
    runs = [_run(example_goal, engineer) for _ in range(4)]
    latest = JoinedRead(AgentRun, where="t0.target_id = ANY(%s)",
                        order_by="t0.created_at DESC, t0.id DESC", limit=3)
    assert [r.pk for r in latest.all([example_goal.target_id])] == \
        [r.pk for r in AgentRun.objects.order_by("-created_at", "-pk")[:3]]
    assert latest.all([runs[0].target_id + 1]) == []


def test_only_some_fields_are_read_the_rest_deferred_and_values_bound_by_name(
        example_goal: Goal, engineer: User) -> None:
    run = _run(example_goal, engineer, state={"big": "x" * 1000})
    read = JoinedRead(AgentRun, "goal_version__goal", "started_by",
                      where='t0.target_id = %(target)s AND t0.status = %(status)s',
                      only={"": ("status", "goal_version", "started_by"),
                            "goal_version__goal": ("name",), "started_by": ("username",)})
    rows = read.all(target=example_goal.target_id, status=run.status)
    assert [r.pk for r in rows] == [run.pk]
    row = rows[0]
    assert row.get_deferred_fields() >= {"state", "base_commit"}
    assert row.started_by.get_deferred_fields() >= {"password", "email"}
    with CaptureQueriesContext(connection) as queries:
        assert (row.status, row.goal_version.goal.name, row.started_by.username) == \
            (run.status, example_goal.name, engineer.username)
    assert len(queries) == 0, "what `only` names is read with the row"
    assert read.all(target=example_goal.target_id, status="no such status") == []
    with pytest.raises(ValueError, match="no field colour"):
        JoinedRead(AgentRun, only={"": ("colour",)}).all(run.pk)


def test_only_forward_foreign_keys_may_be_followed() -> None:
    with pytest.raises(ValueError, match="forward foreign key"):
        JoinedRead(AgentRun, "steps")
    with pytest.raises(ValueError, match="forward foreign key"):
        JoinedRead(AgentRun, "status")


def test_given_rows_answer_the_relation_without_a_query(example_goal: Goal,
                                                        engineer: User) -> None:
    run = _run(example_goal, engineer)
    RunMessage.objects.create(run=run, author=engineer, text="try 8")
    read = RUN_READ.get(run.pk)
    assert read is not None
    give_related(read, "messages", list(run.messages.all()))
    with CaptureQueriesContext(connection) as queries:
        assert [m.text for m in read.messages.all()] == ["try 8"]
    assert len(queries) == 0
    # Chained on, it is the relation's own query again, as after prefetch_related.
    assert [m.text for m in read.messages.all().filter(text="try 8")] == ["try 8"]
    assert list(read.messages.filter(text="other")) == []


# The user backend's statement and the session store.

def test_the_users_statement_names_every_column_of_the_models() -> None:
    assert tuple(f.column for f in User._meta.concrete_fields) == USER_COLUMNS
    assert tuple(f.column for f in ReviewerProfile._meta.concrete_fields) == PROFILE_COLUMNS


def test_the_backend_reads_the_user_with_groups_and_profile(reviewer: User) -> None:
    ReviewerProfile.objects.create(user=reviewer, risk_classes=["numerics"])
    user = OneQueryUserBackend().get_user(reviewer.pk)
    assert user is not None and _values(user) == _values(User.objects.get(pk=reviewer.pk))
    with CaptureQueriesContext(connection) as queries:
        assert user.reviewer_profile.risk_classes == ["numerics"]
        assert user.reviewer_profile.user is user
        assert user.infraops_group_names == ["reviewer"]  # type: ignore[attr-defined]
    assert len(queries) == 0


def test_a_user_without_profile_has_none_without_a_query(engineer: User) -> None:
    user = OneQueryUserBackend().get_user(engineer.pk)
    assert user is not None
    with CaptureQueriesContext(connection) as queries, \
            pytest.raises(ReviewerProfile.DoesNotExist):
        user.reviewer_profile  # noqa: B018
    assert len(queries) == 0


@pytest.mark.parametrize("user_id", [None, "abc", "", 987654, 10**20])
def test_no_user_for_an_id_that_names_none(db: None, user_id: object) -> None:
    assert OneQueryUserBackend().get_user(user_id) is None


def test_an_inactive_user_is_no_user(engineer: User) -> None:
    User.objects.filter(pk=engineer.pk).update(is_active=False)
    assert OneQueryUserBackend().get_user(engineer.pk) is None


def test_the_session_store_loads_what_it_saved_and_nothing_expired(db: None) -> None:
    store = SessionStore()
    store["answer"] = 42
    store.save()
    assert SessionStore(store.session_key).load() == {"answer": 42}
    Session.objects.filter(pk=store.session_key).update(
        expire_date=timezone.now() - timedelta(seconds=1))
    expired = SessionStore(store.session_key)
    assert expired.load() == {} and expired.session_key is None
    assert SessionStore("no-such-key-but-long-enough").load() == {}
    assert SessionStore(None).load() == {}


# The review count and the role check, against the ORM's answers.

@pytest.fixture
def two_targets(tmp_path: Path, example_target: Target) -> tuple[Target, Target]:
    other = target_register(name="other", repo_url=str(make_origin(tmp_path, name="o.git")),
                            base_branch="main", push_on_merge=False)
    return example_target, other


def test_the_count_of_changes_awaiting_review_is_the_orms(two_targets: tuple[Target, Target],
                                                          engineer: User) -> None:
    mine = two_targets[0]
    for n, (target, status, risk) in enumerate(itertools.product(
            two_targets, [Change.Status.PENDING_REVIEW, Change.Status.MERGED],
            [[], ["numerics"], ["concurrency", "production"], [RISK_CLASSES[-1]]])):
        ChangeFactory.create(target=target, title=f"c{n}", diff="", status=status,
                             risk_classes=risk)
    admin = UserFactory.create(username="root", is_superuser=True, member_of=[])
    member_of_one = member(UserFactory.create(username="m", member_of=[]), mine, "reviewer")
    nobody = UserFactory.create(username="n", member_of=[])
    users: list[User | AnonymousUser] = [admin, member_of_one, nobody, engineer, AnonymousUser()]
    for user in users:
        for chosen in ([], ["numerics"], ["concurrency"], ["numerics", "production"]):
            expected = (scoped(awaiting_for_classes(chosen), user).count()
                        if user.is_authenticated else 0)
            assert count_awaiting(user, chosen) == expected, (user, chosen)
    assert count_awaiting(admin, []) > count_awaiting(member_of_one, []) > 0


def test_roles_and_visible_targets_are_the_memberships(two_targets: tuple[Target, Target],
                                                       engineer: User) -> None:
    mine, other = two_targets
    admin = UserFactory.create(username="root", is_superuser=True, member_of=[])
    one = member(UserFactory.create(username="m", member_of=[]), mine, "reviewer")
    assert target_roles(one, mine.pk) == {"reviewer"} and target_roles(one, other.pk) == set()
    assert target_roles(admin, other.pk) == {"engineer", "reviewer"}
    assert target_roles(AnonymousUser(), mine.pk) == set()
    assert visible_target_ids(admin) is None
    assert visible_target_ids(one) == [mine.pk]
    assert visible_target_ids(AnonymousUser()) == []
    assert sorted(visible_target_ids(engineer) or []) == sorted(
        TargetMembership.objects.filter(user=engineer).values_list("target_id", flat=True))
