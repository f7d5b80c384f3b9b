"""/fleet/: the staff's list of workers on other hosts, revoking one (audited), and
registering one in the admin editor (the token shown once)."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from infraops.experiments.fleet import (
    WorkerRefused,
    worker_authenticate,
    worker_heartbeat,
    worker_register,
    worker_revoke,
)
from infraops.models import AuditEntry, Worker
from infraops.version import VERSION
from tests.factories import UserFactory

pytestmark = [pytest.mark.django_db]

GPU = {"kind": "gpu", "model": "NVIDIA H200", "memory_mib": 143771, "driver": "565.57",
       "index": 0}


@pytest.fixture
def staff(db: None) -> User:
    return UserFactory.create(username="sam", roles=["engineer"])


@pytest.fixture
def admin_user(db: None) -> User:
    user = UserFactory.create(username="ada", is_superuser=True)
    user.is_staff = True  # the factory sets is_staff from the roles
    user.save()
    return user


def signed_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def fleet(db: None) -> dict[str, Worker]:
    live, _ = worker_register(name="gpu-live", queues=["experiments", "experiments.gpu"],
                              by=None)
    worker_heartbeat(worker=live, report={"host": "gpu-host-7", "accelerators": [GPU],
                                          "running": "experiment 12", "pid": 4242})
    stale, _ = worker_register(name="cpu-stale", queues=["experiments"], by=None)
    worker_heartbeat(worker=stale, report={"host": "cpu-host-2"})
    Worker.objects.filter(pk=stale.pk).update(last_seen_at=timezone.now() - timedelta(minutes=5),
                                              version="0.23.0")
    gone, _ = worker_register(name="old-box", queues=["experiments"], by=None)
    worker_revoke(worker=gone, by=None)
    return {"live": live, "stale": stale, "gone": gone}


def test_staff_see_every_worker_with_its_state(staff: User, fleet: dict[str, Worker]) -> None:
    page = signed_in(staff).get("/fleet/")

    assert page.status_code == 200
    text = page.content.decode()
    for words in ("gpu-live", "gpu-host-7", "NVIDIA H200 (143771 MiB)", "experiments.gpu",
                  "experiment 12", ">live<", "cpu-stale", ">stale<", "old-box", ">revoked<",
                  f"not {VERSION}", "0.23.0"):
        assert words in text, words
    assert text.count('name="confirm"') == 2  # no revoke button on a revoked worker
    assert 'href="/fleet/"' in text  # the navigation's link


def test_revoking_needs_the_confirmation_then_is_done_and_audited(
        staff: User, fleet: dict[str, Worker]) -> None:
    client = signed_in(staff)
    worker = fleet["live"]

    unconfirmed = client.post(f"/fleet/workers/{worker.name}/revoke", follow=True)
    worker.refresh_from_db()
    assert worker.revoked_at is None
    assert "was not revoked" in unconfirmed.content.decode()

    done = client.post(f"/fleet/workers/{worker.name}/revoke", {"confirm": "yes"}, follow=True)

    worker.refresh_from_db()
    assert worker.revoked_at is not None and worker.revoked_by == staff
    assert "is revoked" in done.content.decode()
    entry = AuditEntry.objects.get(action="worker.revoke", object_id=str(worker.pk))
    assert (entry.actor, entry.data["name"]) == (staff, "gpu-live")


def test_revoking_is_csrf_protected(staff: User, fleet: dict[str, Worker]) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(staff)

    response = client.post(f"/fleet/workers/{fleet['live'].name}/revoke", {"confirm": "yes"})

    assert response.status_code == 403
    assert Worker.objects.get(pk=fleet["live"].pk).revoked_at is None


def test_others_are_refused_the_page_and_the_revoke(viewer: User,
                                                    fleet: dict[str, Worker]) -> None:
    client = signed_in(viewer)

    page = client.get("/fleet/")
    revoke = client.post(f"/fleet/workers/{fleet['live'].name}/revoke", {"confirm": "yes"})
    dashboard = client.get("/")

    assert page.status_code == 403 and revoke.status_code == 403
    assert Worker.objects.get(pk=fleet["live"].pk).revoked_at is None
    assert 'href="/fleet/"' not in dashboard.content.decode()
    assert Client().get("/fleet/").status_code == 302  # signed out: to the sign-in page


def test_the_admin_registers_a_worker_and_shows_its_token_once(admin_user: User) -> None:
    client = signed_in(admin_user)

    response = client.post("/admin/infraops/worker/add/",
                           {"name": "gpu-9", "queues_text": "experiments, experiments.gpu"},
                           follow=True)

    assert response.status_code == 200
    shown = re.findall(r"iow_[A-Za-z0-9]{8}_[A-Za-z0-9_-]{43}", response.content.decode())
    assert len(shown) == 1
    worker = worker_authenticate(f"Bearer {shown[0]}", VERSION)
    assert (worker.name, worker.queues, worker.created_by) == (
        "gpu-9", ["experiments", "experiments.gpu"], admin_user)
    again = client.get(f"/admin/infraops/worker/{worker.pk}/change/")
    assert shown[0] not in again.content.decode()
    assert AuditEntry.objects.filter(action="worker.register", object_id=str(worker.pk)).exists()


def test_the_admin_refuses_bad_queues_in_words(admin_user: User) -> None:
    response = signed_in(admin_user).post("/admin/infraops/worker/add/",
                                          {"name": "gpu-9", "queues_text": "bad queue"})

    assert response.status_code == 200
    assert "is not a queue name" in response.content.decode()
    assert not Worker.objects.exists()


def test_the_admin_revokes_by_an_action(admin_user: User, fleet: dict[str, Worker]) -> None:
    _, token = worker_register(name="gpu-9", queues=["experiments"], by=None)
    worker = Worker.objects.get(name="gpu-9")

    signed_in(admin_user).post("/admin/infraops/worker/", {
        "action": "revoke", "_selected_action": [str(worker.pk)]}, follow=True)

    with pytest.raises(WorkerRefused) as refused:
        worker_authenticate(f"Bearer {token}", VERSION)
    assert refused.value.status == 403
    assert AuditEntry.objects.filter(action="worker.revoke", object_id=str(worker.pk),
                                     actor=admin_user).exists()
