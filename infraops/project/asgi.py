"""One ASGI application for HTTP and websockets."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast
from urllib.parse import urlsplit

import django
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.http import FileResponse, HttpResponse, HttpResponseBase, StreamingHttpResponse
from django.urls import set_script_prefix


class PooledASGIHandler(ASGIHandler):
    """Django's ASGI handler for HTTP, each request served whole by one thread of a fixed pool.

    Every middleware and view of ours is sync. Django's own handler enters a new thread-
    sensitive context per request, which starts a new thread for it, and then hops between
    the event loop and that thread for each stage (the request_started receivers, the
    middleware chain and view, the response's close); under load on this 2-core machine that
    machinery took more of the interpreter than the pages (py-spy: 57% of the samples holding
    the GIL were the event loop's, 40% the views'). Here the event loop reads the body, then
    one call in a pool thread does the rest as Django's WSGI handler would: request_started,
    the request, the middleware chain and view, the rendered content, the response's close
    (request_finished: the thread's database connection goes back to the pool in the thread
    that took it). The loop sends what the thread returns. A streaming response (a static
    file) is iterated in the same thread, each part handed to the loop to send.

    The pool's size is INFRAOPS_WEB_THREADS (settings.WEB_THREADS): enough threads to overlap
    database round trips, few enough that each holds one of the pool's connections. Each
    request runs in a fresh context, so no context variable leaks from one request to the
    next. What is left out of Django's handler: a view is not cancelled when its client
    disconnects (it finishes, and its answer is dropped)."""

    def __init__(self, threads: int) -> None:
        super().__init__()
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="http")

    def load_middleware(self, is_async: bool = False) -> None:
        super().load_middleware(is_async=False)  # the chain runs in a pool thread

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}.")
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        loop = asyncio.get_running_loop()
        respond = functools.partial(self._respond, scope, body_file, send, loop)
        start, body = await loop.run_in_executor(
            self._pool, contextvars.Context().run, respond)
        if start is not None:
            await send(start)
            await send({"type": "http.response.body", "body": body})

    def _respond(self, scope: dict[str, Any], body_file: Any, send: Any,
                 loop: asyncio.AbstractEventLoop) -> tuple[dict[str, Any] | None, bytes]:
        """In a pool thread: the response's start message and body, or (None, b"") when a
        streaming response was sent from here already."""
        response: HttpResponseBase | None = None
        try:
            set_script_prefix(get_script_prefix(scope))
            signals.request_started.send(sender=self.__class__, scope=scope)
            request, error_response = self.create_request(scope, body_file)
            answer = (self.get_response(request) if request is not None
                      else cast(HttpResponseBase, error_response))
            response = answer
            answer._handler_class = self.__class__  # type: ignore[attr-defined]
            start = {"type": "http.response.start", "status": answer.status_code,
                     "headers": _headers(answer)}
            if not answer.streaming:
                return start, cast(HttpResponse, answer).content
            if isinstance(answer, FileResponse):
                answer.block_size = self.chunk_size

            def sent(message: dict[str, Any]) -> None:
                asyncio.run_coroutine_threadsafe(send(message), loop).result()

            sent(start)
            for part in cast(StreamingHttpResponse, answer):
                if part:
                    sent({"type": "http.response.body", "body": bytes(part), "more_body": True})
            sent({"type": "http.response.body"})
            return None, b""
        finally:
            if response is not None:
                response.close()  # request_finished, in the thread that used the connection
            else:
                signals.request_finished.send(sender=self.__class__)
            body_file.close()


def _headers(response: HttpResponseBase) -> list[tuple[bytes, bytes]]:
    """The response's headers and cookies as ASGI wants them (as Django's send_response)."""
    headers = [(name.encode("ascii") if isinstance(name, str) else bytes(name),
                value.encode("latin1") if isinstance(value, str) else bytes(value))
               for name, value in response.items()]
    headers += [(b"Set-Cookie", cookie.output(header="").encode("ascii").strip())
                for cookie in response.cookies.values()]
    return headers


os.environ.setdefault("DJANGO_SETTINGS_MODULE", "infraops.project.settings")
django.setup(set_prefix=False)
from django.conf import settings  # noqa: E402 (needs Django set up first)

django_asgi_app = PooledASGIHandler(settings.WEB_THREADS)

from channels.auth import AuthMiddlewareStack  # noqa: E402 (needs Django set up first)
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
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
