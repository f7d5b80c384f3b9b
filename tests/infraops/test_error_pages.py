"""Our own 403, 404, 405 and 500 pages: each says what happened, in the site's frame with its
navigation, and never shows a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.templatetags.static import static
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
        # static(): the collected, hashed name once a standalone ran in this checkout.
        icon_url = static("img/favicon.svg")
        assert f'rel="icon" href="{icon_url}"' in signed_in.get(path).content.decode()


CSRF = "a" * 32
BODIES = {
    "form": b"username=%2BAGQ-&password=x&csrfmiddlewaretoken=" + CSRF.encode(),
    "multipart": (b"--b\r\nContent-Disposition: form-data; name=\"username\"\r\n\r\n+ZZ\r\n"
                  b"--b--\r\n"),
}


@pytest.mark.parametrize(("content_type", "body"), [
    ("application/x-www-form-urlencoded; charset=utf-7", "form"),
    ("application/x-www-form-urlencoded; charset=utf-16", "form"),
    ("application/x-www-form-urlencoded; charset=latin-1", "form"),
    ("application/x-www-form-urlencoded; charset=no-such-charset", "form"),
    ("application/x-www-form-urlencoded; charset=", "form"),
    ("multipart/form-data; boundary=b; charset=utf-7", "multipart"),
    ("multipart/form-data", "multipart"),
    ("multipart/form-data; boundary=", "multipart"),
    ("text/plain; charset=utf-7", "form"),
    ("application/json; charset=utf-32", "form"),
    ("", "form"),
    ("\u00e9/\u00e9; charset=\u00e9", "form"),
], ids=lambda value: value[:45])
@pytest.mark.parametrize("path", ["/accounts/login/", "/admin/login/", "/"])
def test_no_charset_or_content_type_gives_a_500(content_type: str, body: str, path: str) -> None:
    """Issue 28: a POST to the login page with charset=utf-7 answered 500 (Django's 400 page
    checks the CSRF token, which read the unreadable body a second time)."""
    client = Client(enforce_csrf_checks=True, raise_request_exception=False)
    client.cookies["csrftoken"] = CSRF

    response = client.generic("POST", path, BODIES[body], content_type=content_type,
                              HTTP_X_CSRFTOKEN=CSRF)

    assert response.status_code < 500


def test_a_form_in_utf_7_is_refused_in_words() -> None:
    client = Client(enforce_csrf_checks=True)
    client.cookies["csrftoken"] = CSRF

    response = client.generic("POST", "/accounts/login/", BODIES["form"],
                              content_type="application/x-www-form-urlencoded; charset=utf-7",
                              HTTP_X_CSRFTOKEN=CSRF)

    assert response.status_code == 400
    assert "sent in the utf-7 character set" in response.content.decode()
