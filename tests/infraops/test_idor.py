"""No id of another target's object answers anything but 404 (or a closed socket).

Two targets, each with a goal, goal version, experiment, run and change; one user who is an
engineer on the first only (staff, and allowed to view every record in the admin). Every URL
pattern that takes an id, read from the URLconf (a new one is covered, or the test names it),
and every websocket route that takes one, is swept with 50 ids of its kind: the other target's
ids and ids that do not exist. An answer leaks when it is 2xx or 5xx, or when it differs from
what an id that does not exist gets."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.contrib import admin
from django.contrib.auth.models import Permission, User
from django.contrib.contenttypes.models import ContentType
from django.db import models
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver

from agents.models import AgentRun
from agents.routing import websocket_urlpatterns as agent_sockets
from infraops.models import Experiment, Goal, GoalVersion, Target
from infraops.project.asgi import application
from infraops.routing import websocket_urlpatterns as core_sockets
from reviews.models import Change
from reviews.routing import websocket_urlpatterns as review_sockets
from tests.conftest import member
from tests.factories import (
    AgentRunFactory,
    ChangeFactory,
    ExperimentFactory,
    GoalFactory,
    TargetFactory,
    UserFactory,
)

SWEEP = 50
# URL name (or admin model) -> the model its id names.
SITE_KINDS: dict[str, type[models.Model]] = {
    "infraops:target": Target, "infraops:compare": Target, "infraops:experiment": Experiment,
    "agents:start": Goal,
    "agents:goal": Goal,
    "agents:run": AgentRun, "agents:steer": AgentRun, "agents:control": AgentRun,
    "reviews:change": Change, "reviews:decide": Change, "reviews:merge": Change,
    "reviews:comment": Change,
}
ADMIN_KINDS: dict[str, type[models.Model]] = {
    "infraops.target": Target, "infraops.goal": Goal, "infraops.goalversion": GoalVersion,
    "infraops.experiment": Experiment, "agents.agentrun": AgentRun, "reviews.change": Change,
}
# Admin pages of rows that belong to no target: people, groups, reviewers' classes, the audit
# log (model permissions decide those, the same for every id), the skeleton library.
NOT_TARGET_ROWS = {"auth.user", "auth.group", "reviews.reviewerprofile", "infraops.auditentry",
                   "skeletons.skeleton", "infraops.worker",
                   # who made whom a superuser, and the cool-down: admins only
                   # (tests/reviews/test_separation_of_duties.py)
                   "infraops.superusergrant", "infraops.grantpolicy"}
# Site pages of rows that belong to no target: the skeleton library, by slug. What they show
# of targets' objects is scoped (tests/skeletons/test_skeletons.py).
NOT_TARGET_PAGES = {"skeletons:detail", "skeletons:promote"}
# The fleet: a worker by name (staff only), and what workers on other hosts call, which no
# session opens: only a worker's token, refused with 401 without one
# (tests/infraops/experiments/test_fleet_http.py, test_fleet_git.py, test_fleet_page.py).
NOT_TARGET_PAGES |= {"fleet:revoke", "fleet:blob", "fleet:git", "fleet:git-unknown"}
SOCKET_KINDS: dict[str, type[models.Model]] = {"ws/runs/": AgentRun,
                                               "ws/experiments/": Experiment}


def objects_on(target: Target, owner: User) -> dict[type[models.Model], Any]:
    goal = GoalFactory.create(target=target, name=f"{target.name} latency", owner=owner,
                              boundary__editable_paths="config/**", snapshot_by=owner)
    version = goal.versions.get()
    # Commits, diff and author: the factories' ("b"*40 on "a"*40, one hunk, "run 1").
    experiment = ExperimentFactory.create(target=target)
    run = AgentRunFactory.create(goal_version=version, started_by=owner, base_commit="a" * 40)
    change = ChangeFactory.create(goal=goal, title="t")
    return {Target: target, Goal: goal, GoalVersion: version, Experiment: experiment,
            AgentRun: run, Change: change}


@pytest.fixture
def world(db: None) -> dict[str, Any]:
    mine = TargetFactory.create(name="mine")
    theirs = TargetFactory.create(name="theirs")
    owner = UserFactory.create(username="owen", roles=["engineer"], member_of=[theirs])
    mia = member(UserFactory.create(username="mia", roles=["engineer"], member_of=[]), mine,
                 "engineer")
    mia.user_permissions.add(*Permission.objects.filter(
        codename__in=[f"view_{model._meta.model_name}" for model in ADMIN_KINDS.values()]))
    return {"mia": mia, "mine": objects_on(mine, owner), "theirs": objects_on(theirs, owner)}


def sweep_ids(model: type[models.Model], theirs: dict[type[models.Model], Any]) -> list[str]:
    """The other target's ids of this kind, then ids that do not exist, 50 in all."""
    known = [str(theirs[model].pk)]
    top = int(model._default_manager.order_by("-pk").values_list("pk", flat=True).first() or 0)
    return known + [str(top + 1000 + n) for n in range(SWEEP - len(known))]


def routes(patterns: list[Any], prefix: str = "", namespace: str = "") -> Iterator[
        tuple[str, str]]:
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            inner = namespace + (f"{pattern.namespace}:" if pattern.namespace else "")
            yield from routes(pattern.url_patterns, prefix + str(pattern.pattern), inner)
        elif isinstance(pattern, URLPattern):
            yield prefix + str(pattern.pattern), namespace + (pattern.name or "")


PARAM = re.compile(r"<(?:(\w+):)?(\w+)>")
NOT_IDS = {"app_label", "url"}  # the admin's app index and its catch-all take no id


def id_routes() -> list[tuple[str, str, type[models.Model]]]:
    """(route, name, model) of every URL pattern that takes an id; fails on one it cannot
    place, so a new URL is swept or named here."""
    found = []
    for route, name in routes(get_resolver().url_patterns):
        params = [p for _, p in PARAM.findall(route)] + re.findall(r"\(\?P<(\w+)>", route)
        if not params or set(params) <= NOT_IDS:
            continue
        if name == "admin:view_on_site":
            found += [(route, name, model) for model in ADMIN_KINDS.values()]
            continue
        admin_model = re.match(r"admin/(\w+)/(\w+)/", route)
        label = f"{admin_model[1]}.{admin_model[2]}" if admin_model else ""
        if label in NOT_TARGET_ROWS or name in NOT_TARGET_PAGES:
            continue
        model = ADMIN_KINDS.get(label) or SITE_KINDS.get(name)
        assert model is not None, f"{route} ({name}) takes an id: add its kind to this test"
        found.append((route, name, model))
    return found


def url_for(route: str, model: type[models.Model], object_id: str) -> str:
    def fill(match: re.Match[str]) -> str:
        param = match[2]
        if param == "action":
            return "cancel"
        if param == "content_type_id":
            return str(ContentType.objects.get_for_model(model).pk)
        return object_id

    return "/" + PARAM.sub(fill, route)


def answer(client: Client, url: str) -> int:
    """What the page answers, following redirects: GET, or POST where only POST is served."""
    status = client.get(url, follow=True).status_code
    if status == 405:
        status = client.post(url, {"decision": "approve", "text": "x"}, follow=True).status_code
    return status


def test_no_id_of_another_target_answers_anything_but_404(world: dict[str, Any]) -> None:
    client = Client()
    client.force_login(world["mia"])
    leaks = []
    swept = 0
    for route, _name, model in id_routes():
        by_name = model is Target and not route.startswith("admin/")  # targets/<slug:name>/
        missing = url_for(route, model, "no-such-target" if by_name else "987654321")
        baseline = answer(client, missing)
        # The admin answers 403 for every id of a model one may not touch at all.
        if baseline not in (403, 404) or (not route.startswith("admin/") and baseline != 404):
            leaks.append((missing, baseline))
        ids = sweep_ids(model, world["theirs"])
        if by_name:
            ids = ["theirs"] + [f"no-such-target-{n}" for n in range(SWEEP - 1)]
        for object_id in ids:
            url = url_for(route, model, object_id)
            status = answer(client, url)
            swept += 1
            if status != baseline:
                leaks.append((url, status))
    for htmx in ({}, {"HX-Request": "true"}):  # the partials of the same pages
        for url in (f"/runs/{world['theirs'][AgentRun].pk}/?steps_after=0",
                    f"/reviews/changes/{world['theirs'][Change].pk}/"):
            status = client.get(url, headers=htmx).status_code
            swept += 1
            if status != 404:
                leaks.append((url, status))

    assert swept >= SWEEP * len(SITE_KINDS)
    assert leaks == []


def test_the_same_user_reaches_their_own_targets_objects(world: dict[str, Any]) -> None:
    """The sweep's control: the 404s above are about the target, not about the URLs."""
    client = Client()
    client.force_login(world["mia"])
    mine = world["mine"]

    for url in (f"/targets/{mine[Target].name}/", f"/runs/{mine[AgentRun].pk}/",
                f"/experiments/{mine[Experiment].pk}/", f"/reviews/changes/{mine[Change].pk}/",
                f"/admin/infraops/goal/{mine[Goal].pk}/change/",
                f"/admin/reviews/change/{mine[Change].pk}/change/"):
        assert client.get(url).status_code == 200, url


def socket_routes() -> list[tuple[str, type[models.Model]]]:
    found = []
    for pattern in core_sockets + agent_sockets + review_sockets:
        route = str(pattern.pattern)
        if "<" not in route:
            continue
        model = next((m for prefix, m in SOCKET_KINDS.items() if route.startswith(prefix)), None)
        assert model is not None, f"{route} takes an id: add its kind to this test"
        found.append((route, model))
    return found


@pytest.mark.django_db(transaction=True)
def test_no_socket_of_another_targets_object_opens(world: dict[str, Any],
                                                   close_thread_connections: None,
                                                   ) -> None:
    client = Client()
    client.force_login(world["mia"])
    headers = [(b"origin", b"http://localhost"),
               (b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode())]

    async def opens(path: str) -> bool:
        communicator = WebsocketCommunicator(application, path, headers=headers)
        connected, _ = await communicator.connect(timeout=30)
        await communicator.disconnect()
        return bool(connected)

    opened = []
    for route, model in socket_routes():
        own = "/" + PARAM.sub(str(world["mine"][model].pk), route)
        assert async_to_sync(opens)(own), own  # the control: one's own object's socket opens
        for object_id in sweep_ids(model, world["theirs"]):
            path = "/" + PARAM.sub(object_id, route)
            if async_to_sync(opens)(path):
                opened.append(path)

    assert opened == []


def test_every_admin_model_is_placed_in_or_out_of_the_sweep() -> None:
    registered = {model._meta.label_lower for model in admin.site._registry}
    assert registered == set(ADMIN_KINDS) | NOT_TARGET_ROWS
