"""Login everywhere, a strict Content-Security-Policy on HTML responses, a page for a 405, and
a 503 page while the database does not answer."""

from __future__ import annotations

import codecs
import logging
import sys
from collections.abc import Callable

from django.contrib.auth.views import redirect_to_login
from django.core.signals import got_request_exception
from django.db import InterfaceError, OperationalError
from django.dispatch import receiver
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.template import loader

# Everything is served from our own origin: no CDN, no inline script.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'self'; "
    "form-action 'self'"
)
# The workers' endpoints authenticate every request by the worker's token instead
# (infraops/fleet_views.py).
PUBLIC_PREFIXES = ("/accounts/login/", "/static/", "/healthz", "/admin/login/", "/fleet/api/",
                   "/fleet/git/")


class LoginRequiredMiddleware:
    """Every page needs a signed-in user, except the login page, static files, /healthz and
    the workers' token-authenticated endpoints."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not request.user.is_authenticated and not request.path.startswith(PUBLIC_PREFIXES):
            return redirect_to_login(request.get_full_path())
        return self.get_response(request)


class ContentSecurityPolicyMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if response.get("Content-Type", "").startswith("text/html"):
            response.setdefault("Content-Security-Policy", CSP)
        return response


class MethodNotAllowedPageMiddleware:
    """A 405 says on a page which methods the address takes: Django's require_POST answers
    with an empty body, which a browser shows as a blank page (someone who opened a button's
    address, or reloaded after a form)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if response.status_code != 405 or getattr(response, "streaming", False) or \
                response.content:
            return response
        allowed = [m.strip() for m in response.get("Allow", "").split(",") if m.strip()]
        page = render(request, "405.html", {"allowed": allowed, "method": request.method},
                      status=405)
        page["Allow"] = response.get("Allow", "")
        return page


class FormEncodingMiddleware:
    """A form body (application/x-www-form-urlencoded) in a charset other than UTF-8 answers
    400 with a page that says so, before anything reads it. Django itself refuses such a body
    (BadRequest) when request.POST is first read, but its 400 view requires a CSRF token, and
    the CSRF check read request.POST again while that page was made: the second BadRequest
    became a 500 (a POST to the login page with charset=utf-7, issue 28)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        charset = _foreign_form_charset(request)
        if charset is None:
            return self.get_response(request)
        log.info("a form in %s refused for %s %s", charset, request.method, request.path)
        message = (f"The form was sent in the {charset} character set; this site reads forms "
                   "only in UTF-8.")
        body = loader.get_template("400.html").render({"message": message})
        response = HttpResponse(body, status=400)
        response.setdefault("Content-Security-Policy", CSP)
        return response


def _foreign_form_charset(request: HttpRequest) -> str | None:
    """The charset of a form body that is not UTF-8 (as Django's own check reads it), else
    None. An unknown charset name is ignored by Django (it reads the body as UTF-8)."""
    if request.content_type != "application/x-www-form-urlencoded" or not request.encoding:
        return None
    try:
        name = codecs.lookup(request.encoding).name
    except LookupError:
        return None
    return None if name == "utf-8" else str(request.encoding)[:40]


# --- a database that does not answer ------------------------------------------------------

DATABASE_ERRORS = (OperationalError, InterfaceError)
RETRY_AFTER_SECONDS = 5
_FAILED_ON = "_infraops_database_error"
log = logging.getLogger(__name__)


class DatabaseUnavailableMiddleware:
    """A database that refuses, drops or times out connections gives the 503 page
    (templates/503.html: no traceback, it reloads itself), never a 500. The next request after
    the database is back works: Django closes a connection that failed when its request ends
    (CONN_MAX_AGE = 0 closes every one; a pooled one goes back to the pool, which checks it).

    First in MIDDLEWARE, so that it sees every response. A view's or a template's error comes
    to process_exception; an error in another middleware (the session or the user read in
    LoginRequiredMiddleware, a session save) has already become a 500 when it gets here, so
    the got_request_exception receiver below marks the request and the 500 is replaced."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        try:
            response = self.get_response(request)
        except DATABASE_ERRORS as exc:  # Django turns errors into responses; in case it did not
            return database_unavailable(request, exc)
        failed = getattr(request, _FAILED_ON, None)
        if response.status_code == 500 and isinstance(failed, DATABASE_ERRORS):
            return database_unavailable(request, failed)
        return response

    def process_exception(self, request: HttpRequest,
                          exception: Exception) -> HttpResponse | None:
        if isinstance(exception, DATABASE_ERRORS):
            return database_unavailable(request, exception)
        return None


def database_unavailable(request: HttpRequest, exc: BaseException) -> HttpResponse:
    log.warning("database unavailable for %s %s: %s: %s", request.method, request.path,
                type(exc).__name__, " ".join(str(exc).split())[:300])
    body = loader.get_template("503.html").render({"retry_after": RETRY_AFTER_SECONDS})
    response = HttpResponse(body, status=503)
    response["Retry-After"] = str(RETRY_AFTER_SECONDS)
    response["Cache-Control"] = "no-store"
    response.setdefault("Content-Security-Policy", CSP)
    return response


@receiver(got_request_exception)
def _mark_database_error(sender: object, request: HttpRequest | None = None,
                         **kwargs: object) -> None:
    """Sent while Django turns an error into a 500: remember a database error on the request
    for DatabaseUnavailableMiddleware."""
    exc = sys.exc_info()[1]
    if request is not None and isinstance(exc, DATABASE_ERRORS):
        setattr(request, _FAILED_ON, exc)
