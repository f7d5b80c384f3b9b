"""The review queue and the change page through Django's test client."""

from __future__ import annotations

import html
import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from infraops.models import AuditEntry
from reviews.models import Change, ReviewDecision
from tests.conftest import member

RISK_NOTE = "production: changes the production serving configuration"


def test_the_queue_lists_a_pending_change(client: Client, reviewer: User,
                                         config_change: Change) -> None:
    client.force_login(reviewer)

    response = client.get("/reviews/")

    assert response.status_code == 200
    page = response.content.decode()
    assert f'href="/reviews/changes/{config_change.pk}/"' in page
    assert "Tune batch_size=8" in page
    assert '<span class="badge risk">production</span>' in page
    assert "Nothing awaits review." not in page


def test_the_queue_as_an_htmx_fragment_is_only_the_table(client: Client, viewer: User,
                                                         config_change: Change) -> None:
    client.force_login(viewer)

    response = client.get("/reviews/", headers={"HX-Request": "true"})

    page = response.content.decode()
    assert response.status_code == 200
    assert page.lstrip().startswith('<div id="queue-table">')
    assert "Tune batch_size=8" in page
    assert "<html" not in page


def diff_rows(page: str) -> list[tuple[str, str, list[str]]]:
    """(row classes, line text, risk notes) of every row of the page's diff tables; the
    line's text without its syntax-highlighting markup."""
    rows = re.findall(r'<tr class="([^"]*)"[^>]*>(.*?)</tr>', page, flags=re.DOTALL)
    return [(classes, html.unescape(re.sub(r"<[^>]+>", "", re.findall(
                 r"<pre>(.*?)</pre>", body, flags=re.DOTALL)[0])),
             re.findall(r'<div class="risk-note">(.*?)</div>', body))
            for classes, body in rows if "<pre>" in body]


def test_the_change_page_marks_the_risky_lines_with_their_reason(
    client: Client, reviewer: User, config_change: Change
) -> None:
    client.force_login(reviewer)

    response = client.get(f"/reviews/changes/{config_change.pk}/")

    assert response.status_code == 200
    page = response.content.decode()
    assert "<caption>config/serving.toml</caption>" in page
    assert diff_rows(page) == [
        ("hunk", "@@ -1,3 +1,3 @@", []),
        ("context", "# Serving configuration of the tiny engine.", []),
        ("removed risky", "batch_size = 2", [RISK_NOTE]),
        ("added risky", "batch_size = 8", [RISK_NOTE]),
        ("context", "max_queue = 256", []),
    ]
    assert f'action="/reviews/changes/{config_change.pk}/decide/"' in page


def test_an_invalid_decision_shows_a_message_and_changes_nothing(
    client: Client, reviewer: User, config_change: Change
) -> None:
    client.force_login(reviewer)

    response = client.post(f"/reviews/changes/{config_change.pk}/decide/",
                           {"decision": "merge-it-anyway"}, follow=True)

    assert response.status_code == 200
    assert response.redirect_chain == [(f"/reviews/changes/{config_change.pk}/", 302)]
    assert "Choose approve, reject or request changes." in response.content.decode()
    config_change.refresh_from_db()
    assert config_change.status == Change.Status.PENDING_REVIEW
    assert not ReviewDecision.objects.exists()


def test_a_reviewer_approves_through_the_page(client: Client, reviewer: User,
                                              config_change: Change) -> None:
    client.force_login(reviewer)

    response = client.post(f"/reviews/changes/{config_change.pk}/decide/",
                           {"decision": "approve", "comment": "Fine.",
                            "diff_sha256": config_change.diff_sha256}, follow=True)

    assert response.status_code == 200
    config_change.refresh_from_db()
    assert config_change.status == Change.Status.MERGED
    page = response.content.decode()
    assert f"Change {config_change.pk}: merged." in page
    assert "rae: <strong>Approve</strong>" in page


def test_a_viewer_sees_no_decide_form(client: Client, viewer: User,
                                      config_change: Change) -> None:
    client.force_login(viewer)

    response = client.get(f"/reviews/changes/{config_change.pk}/")

    assert response.status_code == 200
    page = response.content.decode()
    assert RISK_NOTE in page  # the viewer does see the change itself
    assert "/decide/" not in page
    assert 'name="decision"' not in page


def test_a_decision_posted_by_a_viewer_is_refused_with_403_and_audited(
    client: Client, viewer: User, config_change: Change
) -> None:
    client.force_login(viewer)

    response = client.post(f"/reviews/changes/{config_change.pk}/decide/",
                           {"decision": "approve", "diff_sha256": config_change.diff_sha256})

    assert response.status_code == 403
    assert "Only a reviewer can decide on a change." in response.content.decode()
    config_change.refresh_from_db()
    assert config_change.status == Change.Status.PENDING_REVIEW
    assert not ReviewDecision.objects.exists()
    denied = AuditEntry.objects.get(action="change.approve_denied")
    assert (denied.actor, denied.data["reason"]) == (viewer, "Only a reviewer can decide on a "
                                                             "change.")


def test_a_user_without_a_role_is_forbidden(client: Client, config_change: Change) -> None:
    client.force_login(User.objects.create(username="nobody"))

    assert client.get("/reviews/").status_code == 403
    assert client.get(f"/reviews/changes/{config_change.pk}/").status_code == 403


def test_deciding_needs_a_post(client: Client, reviewer: User, config_change: Change) -> None:
    client.force_login(reviewer)

    assert client.get(f"/reviews/changes/{config_change.pk}/decide/").status_code == 405


def test_an_unknown_change_is_not_found(client: Client, reviewer: User) -> None:
    client.force_login(reviewer)

    assert client.get("/reviews/changes/999999/").status_code == 404


@pytest.mark.django_db
@pytest.mark.parametrize("url", [
    "/", "/reviews/", "/reviews/changes/1/", "/runs/1/", "/targets/x/", "/experiments/1/",
])
def test_anonymous_users_are_redirected_to_login(client: Client, url: str) -> None:
    response = client.get(url)

    assert response.status_code == 302
    assert response["Location"] == f"/accounts/login/?next={url}"


@pytest.mark.django_db
def test_an_anonymous_decision_is_redirected_to_login_and_records_nothing(client: Client) -> None:
    response = client.post("/reviews/changes/1/decide/", {"decision": "approve"})

    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/")
    assert not ReviewDecision.objects.exists()


def test_the_person_who_started_the_run_is_not_offered_the_decision(
    client: Any, config_change: Any
) -> None:
    starter = config_change.requested_by
    client.force_login(member(starter, config_change.target, "reviewer"))

    page = client.get(f"/reviews/changes/{config_change.pk}/").content.decode()

    assert "Approve and merge" not in page
    assert "another reviewer must decide on it" in page
