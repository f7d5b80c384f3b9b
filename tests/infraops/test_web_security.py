"""Web hardening that holds for every URL: a state-changing request without a CSRF token is
refused (reliability row D2, docs/reliability.md), and every HTML response carries the security
headers and cookie flags (row D9). The URL list comes from the URLconf itself, so a view added
later is covered without editing this file."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from typing import cast

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.http import HttpResponseBase
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, resolve
from django.urls.exceptions import Resolver404
from django.urls.resolvers import RoutePattern

from tests.conftest import UserFactory

STATE_CHANGING = ("post", "put", "patch", "delete")
# Tried in turn for each parameter of a URL until the path resolves.
SAMPLE_VALUES = ("1", "x", "auth", "infraops")
ROUTE_PARAMETER = re.compile(r"<(?:(?P<converter>[^>:]+):)?(?P<name>[^>]+)>")
CSRF_REFUSAL = b"CSRF verification failed"
WORKER_TOKEN_REFUSAL = b"no worker token"


def _route_parts(pattern: URLPattern | URLResolver) -> list[str]:
    """The pattern's own piece of the path, once per sample value (a regex is made plain)."""
    if isinstance(pattern.pattern, RoutePattern):
        route = str(pattern.pattern)
        return [ROUTE_PARAMETER.sub(value, route) for value in SAMPLE_VALUES]
    regex = str(pattern.pattern).lstrip("^").rstrip("$").replace("\\Z", "")
    return [re.sub(r"\(\?P<[^>]+>[^)]*\)", value, regex).replace("\\", "")
            for value in SAMPLE_VALUES]


def _walk(patterns: list[URLPattern | URLResolver], prefix: str = "") -> Iterator[str]:
    for pattern in patterns:
        for part in _route_parts(pattern):
            if isinstance(pattern, URLResolver):
                yield from _walk(pattern.url_patterns, prefix + part)
            else:
                yield prefix + part


def every_url() -> list[str]:
    """One concrete path per URL pattern of the site (the first sample that resolves to it)."""
    found: dict[str, str] = {}
    for path in _walk(get_resolver().url_patterns):
        try:
            match = resolve("/" + path)
        except Resolver404:
            continue
        found.setdefault(match.route, "/" + path)
    return sorted(found.values())


@pytest.fixture
def admin_client(db: None) -> Client:
    """A superuser with every role, checked for CSRF the way a browser's request is."""
    user = cast(User, UserFactory(username="root", roles=["engineer", "reviewer", "viewer"]))
    user.is_superuser = True
    user.save()
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    return client


def test_the_url_list_covers_the_apps_and_the_admin() -> None:
    urls = every_url()

    for expected in ("/runs/1/steer/", "/runs/1/1/", "/reviews/changes/1/decide/",
                     "/reviews/changes/1/merge/", "/reviews/changes/1/comments/",
                     "/goals/1/runs/", "/accounts/logout/", "/admin/auth/user/1/change/"):
        assert expected in urls, urls
    assert len(urls) > 50


def refused(response: HttpResponseBase) -> bool:
    """Refused for want of a CSRF token; or, at the workers' endpoints (CSRF-exempt: no
    browser calls them), for want of a worker's token, since a session counts for nothing
    there (infraops/fleet_views.py)."""
    content = getattr(response, "content", b"")
    return (response.status_code == 403 and CSRF_REFUSAL in content) or (
        response.status_code == 401 and WORKER_TOKEN_REFUSAL in content)


@pytest.mark.parametrize("method", STATE_CHANGING)
def test_every_url_refuses_a_state_changing_request_without_a_csrf_token(
    admin_client: Client, method: str
) -> None:
    allowed = [(url, response.status_code) for url in every_url()
               if not refused(response := getattr(admin_client, method)(url))]

    assert allowed == []


def test_the_same_post_with_its_token_passes_the_csrf_check(admin_client: Client) -> None:
    # The control for the test above: the client is not refusing everything.
    admin_client.get("/")
    token = admin_client.cookies[settings.CSRF_COOKIE_NAME].value

    response = admin_client.post("/runs/1/steer/", {"text": "hello"}, HTTP_X_CSRFTOKEN=token)

    assert CSRF_REFUSAL not in response.content
    assert response.status_code == 404  # past the check: the run does not exist


@pytest.mark.parametrize("method", STATE_CHANGING)
def test_the_public_urls_refuse_a_signed_out_request_without_a_token_too(method: str) -> None:
    client = Client(enforce_csrf_checks=True)

    for url in ("/accounts/login/", "/admin/login/", "/healthz"):
        response = getattr(client, method)(url, {"username": "x", "password": "y"})
        assert response.status_code == 403 and CSRF_REFUSAL in response.content, url


# --- security headers and cookies (D9) --------------------------------------------------------

HTML_PAGES = ("/", "/reviews/", "/admin/", "/admin/infraops/target/", "/runs/999999/",
              "/does-not-exist/")


def _assert_security_headers(url: str, response: object) -> None:
    headers = response.headers  # type: ignore[attr-defined]
    csp = headers.get("Content-Security-Policy", "")
    script_src = next((d for d in csp.split(";") if d.strip().startswith("script-src")), "")
    assert script_src.split() == ["script-src", "'self'"], (url, csp)
    assert "frame-ancestors 'none'" in csp, url
    assert headers.get("X-Frame-Options") == "DENY", url
    assert headers.get("X-Content-Type-Options") == "nosniff", url
    assert headers.get("Referrer-Policy") == "same-origin", url


def test_every_html_page_carries_the_security_headers(admin_client: Client) -> None:
    signed_out = Client()
    responses = [(url, admin_client.get(url)) for url in HTML_PAGES]
    responses += [(url, signed_out.get(url)) for url in ("/accounts/login/", "/admin/login/")]

    for url, response in responses:
        assert response["Content-Type"].startswith("text/html"), url
        _assert_security_headers(url, response)


def test_the_session_and_csrf_cookies_are_http_only_and_same_site_lax(db: None) -> None:
    UserFactory(username="ana", roles=["viewer"])
    client = Client()
    client.get("/accounts/login/")
    client.post("/accounts/login/", {"username": "ana", "password": "correct horse battery"})

    session, csrf = client.cookies[settings.SESSION_COOKIE_NAME], client.cookies["csrftoken"]
    for cookie in (session, csrf):
        assert cookie["httponly"] is True, cookie.key
        assert cookie["samesite"] == "Lax", cookie.key


def test_behind_tls_every_cookie_is_secure_and_http_is_redirected() -> None:
    code = ("from django.conf import settings as s; print(s.SESSION_COOKIE_SECURE, "
            "s.CSRF_COOKIE_SECURE, s.SECURE_SSL_REDIRECT, s.SECURE_HSTS_SECONDS > 0)")
    result = subprocess.run([sys.executable, "manage.py", "shell", "-c", code],
                            cwd=settings.BASE_DIR, capture_output=True, text=True, timeout=120,
                            env=os.environ | {"INFRAOPS_SECURE": "true"})

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1].split() == ["True", "True", "True", "True"]
