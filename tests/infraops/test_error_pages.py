"""Our own 403, 404, 405 and 500 pages: each says what happened, in the site's frame with its
navigation, and never shows a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client, RequestFactory
from django.views.defaults import server_error

from tests.conftest import UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def signed_in(client: Client, engineer: User) -> Client:
    client.force_login(engineer)
    return client


def test_a_missing_page_is_ours_with_the_navigation(signed_in: Client) -> None:
    response = signed_in.get("/runs/987654/")
    page = response.content.decode()
    assert response.status_code == 404
    assert "<h1>Not found</h1>" in page and 'class="brand"' in page
    assert 'href="/reviews/"' in page and "Back to the dashboard" in page


def test_a_refusal_says_why(client: Client) -> None:
    client.force_login(UserFactory.create(username="nobody", member_of=[]))
    response = client.get("/")
    page = response.content.decode()
    assert response.status_code == 403
    assert "<h1>Not allowed</h1>" in page and "ask an admin for one" in page


def test_a_get_on_a_button_address_says_which_methods_it_takes(signed_in: Client) -> None:
    response = signed_in.get("/runs/1/pause/")
    page = response.content.decode()
    assert response.status_code == 405 and response["Allow"] == "POST"
    assert "takes POST requests, not GET" in page and 'class="brand"' in page
    assert response["Content-Security-Policy"].startswith("default-src 'self'")


def test_a_server_error_page_shows_no_traceback_and_needs_no_context() -> None:
    # Django renders it without the request's context, after something already failed.
    response = server_error(RequestFactory().get("/"))
    page = response.content.decode()
    assert response.status_code == 500
    assert "<h1>Server error</h1>" in page and "Traceback" not in page
    assert 'href="/"' in page


def test_every_page_has_the_favicon(signed_in: Client) -> None:
    icon = Path(settings.BASE_DIR) / "static" / "img" / "favicon.svg"
    assert icon.read_text().startswith("<svg")
    for path in ("/", "/runs/987654/"):
        assert 'rel="icon" href="/static/img/favicon.svg"' in signed_in.get(path).content.decode()
