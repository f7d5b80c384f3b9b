"""Every query parameter and form of the site, fuzzed through Django's test client: 1000
generated inputs for each (334 signed in as each of engineer, reviewer and viewer; set
INFRAOPS_FUZZ_EXAMPLES for more or fewer), and no answer in the 500s.

The surfaces (infraops/project/urls.py, agents/urls.py, reviews/urls.py, the admin's forms):
GET  /runs/<pk>/ after, steps_after (page and htmx partial); /reviews/ scope, status, class,
     target, goal, age, q, after (page and table partial); /reviews/changes/<pk>/ comment;
     /, /targets/<name>/, /experiments/<pk>/ with arbitrary parameters; /accounts/login/ next;
     the admin's changelists (q, o, p, filters).
POST /runs/<pk>/steer/; /runs/<pk>/<action>/; /reviews/changes/<pk>/decide/;
     /reviews/changes/<pk>/comments/; /accounts/login/; /accounts/logout/; the admin's goal
     (with its boundary and criteria), target and reviewer-profile add forms.
/goals/<id>/runs/ and /reviews/changes/<pk>/merge/ take no input (they are POSTed a few times
with random bodies among the pages' own, in the arbitrary-parameter surface).

A plain (non-transactional) database test: the on-commit Celery sends of what a post starts
never run, so nothing reaches a worker. Hypothesis is derandomized: CI sees the same inputs.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import pytest
from django.contrib.auth.models import User
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.events import run_event
from agents.models import AgentRun, Step
from infraops.models import Goal, Target
from reviews.models import Change
from tests.factories import AgentRunFactory, UserFactory
from tests.reviews import conftest as review_fixtures

pytestmark = [pytest.mark.django_db, pytest.mark.fuzz]
commit_on = review_fixtures.commit_on  # a pending change of config/serving.toml
config_change = review_fixtures.config_change

EXAMPLES = int(os.environ.get("INFRAOPS_FUZZ_EXAMPLES", "1000"))  # per surface; fewer: a quick look
PER_ROLE = -(-EXAMPLES // 3)  # each surface runs once per role: 334 x 3 >= 1000 inputs
FUZZ = settings(max_examples=PER_ROLE, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))
ROLES = ("engineer", "reviewer", "viewer")

SPECIAL = [
    "", " ", "0", "-1", "1", "2", "3", "00", "+1", " 1", "1 ", "1.5", "1e9", "1e999", "-0",
    "NaN", "inf", "²", "\u0663", "\uff11", "9" * 11, "9" * 30, "2147483647", "2147483648",
    "9223372036854775807", "9223372036854775808", "-9223372036854775809", "\x00", "a\x00b",
    "%00", "%", "'", '"', "\\", "<script>alert(1)</script>", "../../etc/passwd", "null",
    "true", "[]", "{}", "x" * 5000, "é" * 300, "\u202e", "\ufeff", "\r\n",
    "new:1:config/serving.toml", "old:0:x", "new:99999999999999999999:a", "new::", "new:1:",
    "mine", "all", "any",
    "pending_review", "approved", "production", "none", "24h", "7d", "-", "--upload-pack=x",
    "approve", "reject", "request_changes", "pause", "resume", "cancel", "message",
    "hypothesis", "a" * 64, "0" * 64, "g" * 64, "/", "//evil.example", "https://evil.example",
    "javascript:alert(1)", "/admin/", "-id", "1.2.3", "name", "-name", "0.0.0.0",
]
TEXT = st.text(alphabet=st.characters(codec="utf-8"), max_size=60)
VALUE = st.one_of(st.sampled_from(SPECIAL), TEXT, st.integers(-2**70, 2**70).map(str))
VALUES = st.one_of(VALUE, st.lists(VALUE, min_size=0, max_size=3))  # repeated parameters
per_role = pytest.mark.parametrize("role", ROLES)
HTMX: st.SearchStrategy[dict[str, Any]] = st.one_of(st.just({}), st.fixed_dictionaries(
    {"HTTP_HX_REQUEST": st.just("true")},
    optional={"HTTP_HX_TARGET": st.one_of(st.sampled_from(["queue-table", "run-live", ""]),
                                          TEXT),
              "HTTP_HX_BOOSTED": st.just("true"),
              "HTTP_HX_HISTORY_RESTORE_REQUEST": st.just("true")}))


def params(*names: str) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({}, optional={name: VALUES for name in names})


@pytest.fixture(autouse=True)
def local_throttle(settings: Any) -> None:
    # Thousands of failed sign-ins: count them in this process, not in the shared Redis.
    settings.CACHES = {**settings.CACHES, "login": {
        "BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "fuzz"}}


@pytest.fixture
def users(engineer: User, reviewer: User, viewer: User) -> dict[str, User]:
    return {"engineer": engineer, "reviewer": reviewer, "viewer": viewer}


@pytest.fixture
def clients(users: dict[str, User]) -> dict[str, Client]:
    made = {}
    for role, user in users.items():
        made[role] = Client(REMOTE_ADDR="203.0.113.9")
        made[role].force_login(user)
    return made


@pytest.fixture
def run(example_goal: Goal, engineer: User) -> AgentRun:
    made = AgentRunFactory.create(goal=example_goal, started_by=engineer)
    for message in ("Run started.", "Step 1.", "<b>three</b>"):
        run_event(run_id=made.pk, kind="status", message=message)
    Step.objects.create(run=made, number=1, summary="tried batch 8", tool="set_config",
                        calls=[{"name": "set_config", "arguments": {"batch": 8}, "ok": True}])
    made.step_count = 1
    made.save(update_fields=["step_count"])
    return made


class Seen:
    """Counts the roles and statuses of one fuzz; fails on any answer in the 500s."""

    def __init__(self) -> None:
        self.roles: Counter[str] = Counter()
        self.statuses: Counter[int] = Counter()

    def check(self, role: str, send: Callable[[], Any], what: str) -> None:
        response = send()  # the test client re-raises a view's exception: the 500's cause
        self.roles[role] += 1
        self.statuses[response.status_code] += 1
        assert response.status_code < 500, f"{what} as {role}: {response.status_code}"

    def covered(self, role: str) -> None:
        assert self.roles[role] >= PER_ROLE, self.roles  # every input was sent


# --- GET ------------------------------------------------------------------------------------


@per_role
def test_the_run_page_and_its_partials(
    role: str, clients: dict[str, Client], run: AgentRun,
) -> None:
    seen = Seen()

    @FUZZ
    @given(query=params("after", "steps_after"), headers=HTMX)
    def fuzz(query: dict[str, Any], headers: dict[str, Any]) -> None:
        seen.check(role, lambda: clients[role].get(f"/runs/{run.pk}/", query, **headers),
                   f"GET /runs/{run.pk}/ {query!r} {headers!r}")

    fuzz()
    seen.covered(role)


@per_role
def test_the_review_queue_filters(
    role: str, clients: dict[str, Client], config_change: Change,
) -> None:
    seen = Seen()

    @FUZZ
    @given(query=params("scope", "status", "class", "target", "goal", "age", "q",
                                   "after"), headers=HTMX)
    def fuzz(query: dict[str, Any], headers: dict[str, Any]) -> None:
        seen.check(role, lambda: clients[role].get("/reviews/", query, **headers),
                   f"GET /reviews/ {query!r} {headers!r}")

    fuzz()
    seen.covered(role)


@per_role
def test_the_change_page_comment_parameter(role: str, clients: dict[str, Client],
                                           config_change: Change) -> None:
    seen = Seen()
    url = f"/reviews/changes/{config_change.pk}/"

    @FUZZ
    @given(query=params("comment"), headers=HTMX)
    def fuzz(query: dict[str, Any], headers: dict[str, Any]) -> None:
        seen.check(role, lambda: clients[role].get(url, query, **headers),
                   f"GET {url} {query!r} {headers!r}")

    fuzz()
    seen.covered(role)


@per_role
def test_pages_without_parameters_ignore_any_and_bodiless_posts(role: str,
    clients: dict[str, Client], run: AgentRun, config_change: Change, example_goal: Goal
) -> None:
    seen = Seen()
    target: Target = example_goal.target
    pages = ["/", f"/targets/{target.name}/", "/targets/no-such-target/",
             "/experiments/1/", "/experiments/999999999/", "/healthz", "/accounts/login/"]
    bodiless = [f"/goals/{example_goal.pk}/runs/", f"/reviews/changes/{config_change.pk}/merge/"]

    @FUZZ
    @given(page=st.sampled_from(pages + bodiless), post=st.booleans(),
           query=st.dictionaries(st.one_of(st.sampled_from(["next", "after", "page", "q"]),
                                           TEXT.filter(bool)), VALUES, max_size=4))
    def fuzz(page: str, post: bool, query: dict[str, Any]) -> None:
        client = clients[role]
        if page in bodiless:
            # Starting a run or merging: once in a while, as the pages' buttons do.
            if not post or len(query) > 1:
                return
            seen.check(role, lambda: client.post(page, query), f"POST {page} {query!r}")
            return
        seen.check(role, lambda: client.get(page, query), f"GET {page} {query!r}")

    fuzz()
    assert seen.roles[role] >= PER_ROLE // 4  # the bodiless posts are sampled, not all sent


@per_role
def test_the_admin_changelists(role: str, clients: dict[str, Client], run: AgentRun,
                               config_change: Change) -> None:
    seen = Seen()
    lists = ["/admin/infraops/target/", "/admin/infraops/goal/", "/admin/infraops/goalversion/",
             "/admin/infraops/experiment/", "/admin/infraops/auditentry/",
             "/admin/agents/agentrun/", "/admin/reviews/change/",
             "/admin/reviews/reviewerprofile/", "/admin/auth/user/"]

    @FUZZ
    @given(page=st.sampled_from(lists),
           query=params("q", "o", "p", "status", "action", "all", "e", "_to_field",
                        "_popup", "id__exact", "created_at__gte"))
    def fuzz(page: str, query: dict[str, Any]) -> None:
        seen.check(role, lambda: clients[role].get(page, query), f"GET {page} {query!r}")

    fuzz()
    seen.covered(role)


# --- POST -----------------------------------------------------------------------------------


@per_role
def test_the_steer_form(role: str, clients: dict[str, Client], run: AgentRun) -> None:
    seen = Seen()
    url = f"/runs/{run.pk}/steer/"

    @FUZZ
    @given(form=params("kind", "text", "title"))
    def fuzz(form: dict[str, Any]) -> None:
        seen.check(role, lambda: clients[role].post(url, form), f"POST {url} {form!r}")

    fuzz()
    seen.covered(role)


@per_role
def test_the_run_controls(role: str, clients: dict[str, Client], run: AgentRun) -> None:
    seen = Seen()

    @FUZZ
    @given(action=st.one_of(st.sampled_from(["pause", "resume", "cancel"]),
                                       VALUE.filter(lambda v: v not in ("", ".", ".."))),
           headers=HTMX, form=params("action", "next"))
    def fuzz(action: str, headers: dict[str, Any], form: dict[str, Any]) -> None:
        url = f"/runs/{run.pk}/{quote(action, safe='')}/"
        seen.check(role, lambda: clients[role].post(url, form, **headers),
                   f"POST {url} {form!r} {headers!r}")

    fuzz()
    seen.covered(role)


@per_role
def test_the_decision_form(role: str, clients: dict[str, Client], config_change: Change) -> None:
    seen = Seen()
    url = f"/reviews/changes/{config_change.pk}/decide/"
    sha = st.one_of(st.just(config_change.diff_sha256), VALUE)

    @FUZZ
    @given(form=st.fixed_dictionaries({}, optional={
        "decision": VALUES, "comment": VALUES, "diff_sha256": sha}))
    def fuzz(form: dict[str, Any]) -> None:
        seen.check(role, lambda: clients[role].post(url, form), f"POST {url} {form!r}")

    fuzz()
    seen.covered(role)


@per_role
def test_the_line_comment_form(
    role: str, clients: dict[str, Client], config_change: Change,
) -> None:
    seen = Seen()
    url = f"/reviews/changes/{config_change.pk}/comments/"

    @FUZZ
    @given(form=st.fixed_dictionaries({}, optional={
        "path": st.one_of(st.just("config/serving.toml"), VALUES),
        "line": VALUES, "side": VALUES, "text": VALUES}))
    def fuzz(form: dict[str, Any]) -> None:
        seen.check(role, lambda: clients[role].post(url, form), f"POST {url} {form!r}")

    fuzz()
    seen.covered(role)


@per_role
def test_the_login_and_logout_forms(role: str, users: dict[str, User]) -> None:
    seen = Seen()

    @FUZZ
    @given(path=st.sampled_from(["/accounts/login/", "/admin/login/",
                                            "/accounts/logout/"]),
           known=st.booleans(), form=params("username", "password", "next"),
           query=st.one_of(st.just(""), VALUE.map(lambda v: "?next=" + quote(v, safe=""))))
    def fuzz(path: str, known: bool, form: dict[str, Any], query: str) -> None:
        client = Client(REMOTE_ADDR="203.0.113.10")
        if path == "/accounts/logout/":
            client.force_login(users[role])
        elif known:
            form = {**form, "username": users[role].username}
        seen.check(role, lambda: client.post(path + query, form), f"POST {path + query} {form!r}")

    fuzz()
    seen.covered(role)


def admin_form(client: Client, url: str) -> dict[str, str]:
    from tests.infraops.test_admin import form_of

    return form_of(client, url)


@per_role
def test_the_admin_goal_form_with_its_boundary_and_criteria(role: str,
    clients: dict[str, Client], example_target: Target
) -> None:
    seen = Seen()
    base = admin_form(clients["engineer"], "/admin/infraops/goal/add/") | {
        "target": str(example_target.pk), "name": "fuzz", "probe": "latency-bench",
        "metric": "latency_ms", "direction": "minimize", "relative_target": "0.1",
        "boundary-0-editable_paths": "config/**",
    }
    names = [n for n in base if not n.endswith(("TOTAL_FORMS", "INITIAL_FORMS", "MIN_NUM_FORMS",
                                                 "MAX_NUM_FORMS"))]
    criterion = {f"criteria-0-{n}": VALUES for n in ("kind", "probe", "metric", "variant",
                                                     "reference_variant", "comparison", "value")}

    @FUZZ
    @given(changes=st.fixed_dictionaries({}, optional={
        **{n: VALUES for n in names}, **criterion,
        "criteria-TOTAL_FORMS": st.sampled_from(["0", "1", "2", "3", "-1", "x"]),
        "boundary-TOTAL_FORMS": st.sampled_from(["0", "1", "2", "x"])}))
    def fuzz(changes: dict[str, Any]) -> None:
        if any(k.startswith("criteria-0-") for k in changes):
            changes.setdefault("criteria-TOTAL_FORMS", "1")
        form = base | changes
        seen.check(role, lambda: clients[role].post("/admin/infraops/goal/add/", form),
                   f"POST /admin/infraops/goal/add/ {changes!r}")

    fuzz()
    seen.covered(role)


@per_role
def test_the_admin_target_and_reviewer_profile_forms(role: str,
    clients: dict[str, Client], users: dict[str, User], example_target: Target
) -> None:
    seen = Seen()
    # Repository addresses that git reads at once (local paths, file://): a host:path address
    # would start ssh, which this sandbox cannot reach, and is not what a fuzz should wait on.
    url = st.one_of(st.just(example_target.repo_url), st.just("file:///nonexistent"),
                    VALUE.filter(lambda v: ":" not in v))
    target_form = st.fixed_dictionaries({}, optional={
        "name": VALUES, "repo_url": url, "base_branch": VALUES, "push_on_merge": VALUES})
    profile_form = st.fixed_dictionaries({}, optional={
        "user": st.one_of(st.just(str(users["reviewer"].pk)), VALUES),
        "risk_classes": VALUES})

    @FUZZ
    @given(which=st.sampled_from(["target", "profile"]), target=target_form,
           profile=profile_form)
    def fuzz(which: str, target: dict[str, Any], profile: dict[str, Any]) -> None:
        if which == "target":
            path, form = "/admin/infraops/target/add/", target
        else:
            path, form = "/admin/reviews/reviewerprofile/add/", profile
        seen.check(role, lambda: clients[role].post(path, form), f"POST {path} {form!r}")

    fuzz()
    seen.covered(role)


def test_a_signed_out_visitor_is_sent_to_sign_in_whatever_the_input() -> None:
    """The control: no role, and every page redirects (none answers 500 either)."""
    seen = Seen()
    UserFactory.create(username="nobody-here", roles=[])
    client = Client()

    @settings(max_examples=200, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(page=st.sampled_from(["/", "/runs/1/", "/reviews/", "/reviews/changes/1/",
                                 "/experiments/1/"]), query=params("after", "comment", "q"))
    def fuzz(page: str, query: dict[str, Any]) -> None:
        response = client.get(page, query)
        seen.statuses[response.status_code] += 1
        assert response.status_code == 302
        assert response["Location"].startswith("/accounts/login/")

    fuzz()
