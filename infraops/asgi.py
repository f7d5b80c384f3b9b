"""One ASGI application for HTTP and websockets."""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlsplit

import django
from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIHandler
from django.http import HttpRequest, HttpResponseBase


class SyncChainASGIHandler(ASGIHandler):
    """Django's ASGI handler, with the middleware chain and the view run as one sync call.

    Every middleware and view of ours is sync. Django's own handler builds an async chain, so
    under it the sync middleware ran in the request's thread, went back to the event loop
    (async_to_sync) for Django's view machinery, and that went into the thread again for the
    view: four switches between the loop and the thread a request instead of one, each a
    wake-up of a thread waiting on a condition, which on this 2-core machine under load cost
    more than the dashboard's queries. Here the whole chain runs in the request's own thread
    (thread-sensitive: the request's database connection opens and closes there, as before),
    entered once. An async view would still work (Django adapts it), only slower; there is
    none."""

    def load_middleware(self, is_async: bool = False) -> None:
        super().load_middleware(is_async=False)

    async def get_response_async(self, request: HttpRequest) -> HttpResponseBase:
        return await sync_to_async(self.get_response, thread_sensitive=True)(request)


os.environ.setdefault("DJANGO_SETTINGS_MODULE", "infraops.settings")
django.setup(set_prefix=False)
django_asgi_app = SyncChainASGIHandler()

from channels.auth import AuthMiddlewareStack  # noqa: E402 (needs Django set up first)
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.conf import settings  # noqa: E402
from django.http.request import split_domain_port, validate_host  # noqa: E402

from agents.routing import websocket_urlpatterns as agent_sockets  # noqa: E402
from infraops.routing import websocket_urlpatterns as core_sockets  # noqa: E402
from reviews.routing import websocket_urlpatterns as review_sockets  # noqa: E402

DEFAULT_PORTS = {"http": 80, "https": 443}


def _origin_tuple(scheme: str, host: str, port: int | None) -> tuple[str, str, int] | None:
    scheme = scheme.lower()
    if scheme not in DEFAULT_PORTS or not host:
        return None
    return scheme, host.lower().strip("[]"), port or DEFAULT_PORTS[scheme]


def parse_origin(text: str) -> tuple[str, str, int] | None:
    """('https', 'host', 443) of 'https://host', None for anything that is not an origin."""
    try:
        parts = urlsplit(text.strip())
        port = parts.port
    except ValueError:
        return None
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        return None
    return _origin_tuple(parts.scheme, parts.hostname or "", port)


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


def _own_scheme(scope: dict[str, Any]) -> str:
    """http or https, as the page that opened the socket had it (Django's is_secure rule)."""
    proxy = settings.SECURE_PROXY_SSL_HEADER
    if proxy:
        header, secure_value = proxy
        name = header.removeprefix("HTTP_").replace("_", "-").lower().encode()
        forwarded = _header(scope, name)
        if forwarded is not None:
            return "https" if forwarded.split(",")[0].strip() == secure_value else "http"
    return "https" if scope.get("scheme") in ("wss", "https") else "http"


def _trusted(origin: tuple[str, str, int]) -> bool:
    """In CSRF_TRUSTED_ORIGINS, scheme and port included ('https://*.example.com' too)."""
    scheme, host, port = origin
    for entry in settings.CSRF_TRUSTED_ORIGINS:
        wildcard = "://*." in entry
        trusted = parse_origin(entry.replace("://*.", "://", 1) if wildcard else entry)
        if trusted is None or trusted[0] != scheme or trusted[2] != port:
            continue
        if host == trusted[1] or (wildcard and host.endswith("." + trusted[1])):
            return True
    return False


def origin_allowed(scope: dict[str, Any]) -> bool:
    """The websocket's Origin is the server's own origin (scheme, host and port of the
    request, the host one of ALLOWED_HOSTS) or one of CSRF_TRUSTED_ORIGINS. No Origin: no."""
    raw = _header(scope, b"origin")
    origin = parse_origin(raw) if raw else None
    if origin is None:
        return False
    if _trusted(origin):
        return True
    host_header = _header(scope, b"host")
    if host_header is not None:
        host, port_text = split_domain_port(host_header.strip().lower())
        if not host or not validate_host(host, settings.ALLOWED_HOSTS):
            return False
        try:
            port = int(port_text) if port_text else None
        except ValueError:
            return False
        own = _origin_tuple(_own_scheme(scope), host, port)
    elif scope.get("server"):
        # No Host header (never from a browser): the address the server listens on.
        server_host, server_port = scope["server"][0], scope["server"][1]
        if not validate_host(str(server_host).lower(), settings.ALLOWED_HOSTS):
            return False
        own = _origin_tuple(_own_scheme(scope), str(server_host), server_port)
    else:
        # Neither (an in-process test client): an allowed host on its scheme's default port.
        own = origin if validate_host(origin[1], settings.ALLOWED_HOSTS) \
            and origin[2] == DEFAULT_PORTS[origin[0]] else None
    return own is not None and own == origin


class OriginValidator:
    """Refuses a websocket whose Origin is not this site's (scheme and port included):
    channels' AllowedHostsOriginValidator compared host names only."""

    def __init__(self, application: Any) -> None:
        self.application = application

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if scope["type"] == "websocket" and not origin_allowed(scope):
            await receive()  # websocket.connect
            await send({"type": "websocket.close", "code": 4403})
            return None
        return await self.application(scope, receive, send)


# The project's composition root: it alone wires every app's sockets together.

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": OriginValidator(
            AuthMiddlewareStack(URLRouter(core_sockets + agent_sockets + review_sockets))
        ),
    }
)
