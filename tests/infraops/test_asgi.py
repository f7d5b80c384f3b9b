"""The web process's HTTP handler (infraops.project.asgi.PooledASGIHandler), through the ASGI
protocol:
what the event loop sends is what the pool thread made, streaming responses included."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from asgiref.sync import async_to_sync
from asgiref.testing import ApplicationCommunicator
from django.conf import settings

STATIC_CSS = Path(settings.BASE_DIR) / "static" / "css" / "infraops.css"


def http(path: str, method: str = "GET", body: bytes = b"") -> tuple[dict[str, Any], bytes,
                                                                      list[dict[str, Any]]]:
    """The response's start message, its whole body and every body message, as a server
    would receive them."""
    from infraops.project.asgi import application

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": method, "scheme": "http", "path": path, "raw_path": path.encode(),
             "query_string": b"", "root_path": "",
             "headers": [(b"host", b"127.0.0.1"), (b"content-length", str(len(body)).encode())],
             "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000)}

    async def exchange() -> tuple[dict[str, Any], list[dict[str, Any]]]:
        app = ApplicationCommunicator(application, scope)
        await app.send_input({"type": "http.request", "body": body, "more_body": False})
        start = await app.receive_output(timeout=60)
        parts = [await app.receive_output(timeout=60)]
        while parts[-1].get("more_body"):
            parts.append(await app.receive_output(timeout=60))
        await app.wait(timeout=60)
        return start, parts

    start, parts = async_to_sync(exchange)()
    return start, b"".join(part.get("body", b"") for part in parts), parts


def test_a_page_comes_back_with_its_status_headers_and_cookies() -> None:
    start, body, _ = http("/accounts/login/")

    assert start["type"] == "http.response.start" and start["status"] == 200
    headers = [(name.lower(), value) for name, value in start["headers"]]
    assert (b"content-type", b"text/html; charset=utf-8") in headers
    assert any(name == b"set-cookie" and value.startswith(b"csrftoken=")
               for name, value in headers)
    assert any(name == b"content-security-policy" for name, _ in headers)
    assert b'name="csrfmiddlewaretoken"' in body


def test_a_static_file_streams_from_the_pool_thread_whole() -> None:
    start, body, parts = http("/static/css/infraops.css")

    assert start["status"] == 200
    assert body == STATIC_CSS.read_bytes()
    assert parts[-1] == {"type": "http.response.body"}  # the end, sent apart


def test_a_malformed_request_gets_django_s_answer_not_a_crash() -> None:
    start, body, _ = http("/accounts/login/", method="POST", body=b"username=x")

    assert start["status"] == 403  # no CSRF token: refused, with the page that says so
    assert b"CSRF" in body


def test_a_signed_out_visit_is_sent_to_the_login_page() -> None:
    start, _, _ = http("/no/such/page/")

    assert start["status"] == 302
    assert (b"location", b"/accounts/login/?next=/no/such/page/") in [
        (name.lower(), value) for name, value in start["headers"]]
