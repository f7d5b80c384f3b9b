"""The sign-in throttle, for /accounts/login/ and the admin's login page.

LOGIN_FAILURES_PER_USERNAME failed sign-ins for one username, or LOGIN_FAILURES_PER_ADDRESS
from one client address, within LOGIN_FAILURE_WINDOW_SECONDS lock further attempts (right
password or not) for LOGIN_LOCKOUT_SECONDS, with a message that says so and status 429. A
successful sign-in clears its username's count. The counts live in the "login" cache (Redis),
so every web process sees the same ones; if that cache fails, sign-in is not blocked (the
failure is logged).
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

from django import forms
from django.conf import settings
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth import views as auth_views
from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.forms import AuthenticationForm
from django.core.cache import caches
from django.http import HttpRequest, HttpResponse

from infraops.ratelimit import window_count

log = logging.getLogger(__name__)

LOCKED_MESSAGE = ("Too many failed sign-ins for this account or from this address: sign-in "
                  "is locked for {minutes} minutes. Try again later.")


def _cache() -> Any:
    return caches["login"]


def identity(username: str) -> str:
    """The one name every spelling of a username counts under: Django's own normalisation
    (NFKC, as the sign-in form applies before checking the password), then case-folded and
    stripped. On the raw name, five failures locked `norole` while `\uff4eorole` (a fullwidth n,
    the same account to Django) signed in with the right password (issue 28)."""
    return AbstractBaseUser.normalize_username(username).strip().casefold()


def _keys(username: str, address: str) -> dict[str, str]:
    who = hashlib.sha256(identity(username).encode(errors="replace")).hexdigest()[:32]
    where = hashlib.sha256(address.encode(errors="replace")).hexdigest()[:32]
    return {"user": f"user:{who}", "ip": f"ip:{where}"}


def client_address(request: HttpRequest | None) -> str:
    return str(request.META.get("REMOTE_ADDR", "")) if request is not None else ""


def is_locked(username: str, address: str) -> bool:
    keys = _keys(username, address)
    try:
        found = _cache().get_many([f"lock:{keys['user']}", f"lock:{keys['ip']}"])
    except Exception:
        log.exception("the sign-in throttle could not read its counts")
        return False
    return bool(found)


def record_failure(username: str, address: str) -> bool:
    """Count one failed sign-in; True when that locks the username or the address."""
    limits = {"user": settings.LOGIN_FAILURES_PER_USERNAME,
              "ip": settings.LOGIN_FAILURES_PER_ADDRESS}
    locked = False
    try:
        cache = _cache()
        for kind, key in _keys(username, address).items():
            count = window_count(cache, f"count:{key}", settings.LOGIN_FAILURE_WINDOW_SECONDS)
            if count >= limits[kind]:
                cache.set(f"lock:{key}", 1, timeout=settings.LOGIN_LOCKOUT_SECONDS)
                cache.delete(f"count:{key}")
                locked = True
    except Exception:
        log.exception("the sign-in throttle could not count a failure")
    return locked


def record_success(username: str, address: str) -> None:
    try:
        _cache().delete(f"count:{_keys(username, address)['user']}")
    except Exception:
        log.exception("the sign-in throttle could not clear a count")


def reset(username: str, address: str) -> None:
    """Forget the counts and locks of a username and an address (tests, an admin's shell)."""
    keys = _keys(username, address)
    _cache().delete_many([f"{prefix}:{key}" for key in keys.values()
                          for prefix in ("count", "lock")])


class ThrottledLoginMixin(forms.Form):
    """For an AuthenticationForm: refuse while locked, count failures, clear on success."""

    request: HttpRequest | None
    locked = False

    def clean(self) -> dict[str, Any]:
        username = str(self.data.get("username", ""))[:300]
        address = client_address(self.request)
        if is_locked(username, address):
            self.locked = True
            raise forms.ValidationError(self._locked_message(), code="locked")
        try:
            data: dict[str, Any] = super().clean() or {}
        except forms.ValidationError as error:
            if getattr(error, "code", None) == "invalid_login" and record_failure(username,
                                                                                  address):
                self.locked = True
                raise forms.ValidationError(self._locked_message(), code="locked") from None
            raise
        record_success(username, address)
        return data

    @staticmethod
    def _locked_message() -> str:
        return LOCKED_MESSAGE.format(minutes=max(settings.LOGIN_LOCKOUT_SECONDS // 60, 1))


class ThrottledAuthenticationForm(ThrottledLoginMixin, AuthenticationForm):
    pass


class ThrottledAdminAuthenticationForm(ThrottledLoginMixin, AdminAuthenticationForm):
    pass


class LoginView(auth_views.LoginView):
    authentication_form = ThrottledAuthenticationForm

    def form_invalid(self, form: Any) -> HttpResponse:
        response = super().form_invalid(form)
        if getattr(form, "locked", False):
            response.status_code = 429
        return response
