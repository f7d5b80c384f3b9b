"""Database connections of the web process, and pages while the database does not answer.

The web process (uvicorn, ASGI) keeps no connection per request thread: CONN_MAX_AGE = 0, with
a bounded psycopg pool (INFRAOPS_DB_POOL_SIZE, 10 unless told) or, with 0, a connection per
request (infraops/project/settings.py). Before, with
CONN_MAX_AGE = 60, 5 x 10 concurrent requests left 31 connections open for over a minute.
A database that refuses or drops connections gives the 503 page, never a 500, and the site
recovers by itself (infraops.project.middleware.DatabaseUnavailableMiddleware)."""

from __future__ import annotations

import contextlib
import http.cookiejar
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil
import psycopg
import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.db import InterfaceError, OperationalError, connection
from django.http import HttpRequest, HttpResponse
from django.test import Client
from django.urls import path

from infraops.models import Target
from infraops.project.settings import DEFAULT_POOL_SIZE, process_kind
from tests.conftest import UserFactory
from tests.e2e.conftest import _wait_for, free_port, stop_processes, system_env

PASSWORD = "correct horse battery"
APP_NAME = "infraops-web-under-test"
POOL_SIZE = 6  # INFRAOPS_DB_POOL_SIZE where a test runs the web process with a pool
WITH_POOL = {"INFRAOPS_DB_POOL_SIZE": str(POOL_SIZE)}
NO_POOL = {"INFRAOPS_DB_POOL_SIZE": "0"}
DB_DOWN_TEXT = "The database is not answering; retrying..."


# --- the settings: which process keeps what ------------------------------------------------


@pytest.mark.parametrize(("argv", "kind"), [
    (["/x/.venv/lib/python3.11/site-packages/uvicorn/__main__.py",
      "infraops.project.asgi:application"], "web"),
    (["/x/.venv/bin/uvicorn", "infraops.project.asgi:application"], "web"),
    (["/x/.venv/bin/gunicorn", "-k", "uvicorn.workers.UvicornWorker"], "web"),
    (["/x/site-packages/celery/__main__.py", "-A", "infraops.project", "worker", "-Q", "agent"],
     "worker"),
    (["/x/.venv/bin/celery", "-A", "infraops.project", "beat"], "other"),
    (["manage.py", "migrate"], "other"),
    (["/x/.venv/bin/pytest", "-q"], "other"),
    ([], "other"),
])
def test_the_process_kind_comes_from_how_it_was_started(argv: list[str], kind: str) -> None:
    assert process_kind(argv) == kind
    assert process_kind(argv, "worker") == "worker"  # INFRAOPS_PROCESS wins


def test_this_process_keeps_no_connection_across_requests() -> None:
    assert settings.DATABASES["default"]["CONN_MAX_AGE"] == 0
    assert "pool" not in settings.DATABASES["default"]["OPTIONS"]  # a pool is the web's


def _settings_of(kind: str, **env: str) -> dict[str, Any]:
    code = ("import json, django.conf as c; d = c.settings.DATABASES['default']; "
            "print(json.dumps([d['CONN_MAX_AGE'], d['OPTIONS'].get('pool')]))")
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True,
        cwd=settings.BASE_DIR,
        env=system_env(Path(settings.DATA_DIR)) | {"INFRAOPS_PROCESS": kind} | env)
    import json

    result: dict[str, Any] = dict(zip(["max_age", "pool"], json.loads(out.stdout), strict=True))
    return result


def test_the_web_process_pools_its_connections_and_the_worker_keeps_its_own() -> None:
    assert _settings_of("web", **NO_POOL) == {"max_age": 0, "pool": None}
    pooled = _settings_of("web")
    assert pooled["max_age"] == 0
    assert pooled["pool"]["max_size"] == DEFAULT_POOL_SIZE and pooled["pool"]["timeout"] <= 5
    assert _settings_of("web", **WITH_POOL)["pool"]["max_size"] == POOL_SIZE
    assert _settings_of("worker") == {"max_age": 60, "pool": None}
    assert _settings_of("worker", **WITH_POOL) == {"max_age": 60, "pool": None}


# --- a real web process -----------------------------------------------------------------


class Proxy:
    """A TCP forwarder to PostgreSQL that can go away (refusing connections and cutting those
    it carries) and come back on the same port: a database outage the test controls."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.port = free_port()
        self._listener: socket.socket | None = None
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()

    def start(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(128)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def stop(self) -> None:
        if self._listener is not None:
            # shutdown() wakes the accept() blocked on it; close() alone would not, and the
            # socket would go on accepting.
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._listener = None
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            self._sockets.clear()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets |= {client, server}
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                sink.shutdown(socket.SHUT_WR)


class Browser:
    """A signed-in person, as far as cookies and CSRF go (urllib; thread-safe)."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar))

    def sign_in(self, username: str) -> None:
        page = self.get("/accounts/login/")[1]
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
        assert token is not None
        body = urllib.parse.urlencode({"username": username, "password": PASSWORD,
                                       "csrfmiddlewaretoken": token.group(1)}).encode()
        request = urllib.request.Request(f"{self.base}/accounts/login/", data=body,
                                         headers={"Referer": f"{self.base}/accounts/login/"})
        with self.opener.open(request, timeout=30) as response:
            assert response.status == 200 and response.url == f"{self.base}/", response.url

    def get(self, path: str) -> tuple[int, str, dict[str, str]]:
        try:
            with self.opener.open(f"{self.base}{path}", timeout=30) as response:
                return response.status, response.read().decode(), _lower(response.headers)
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode(), _lower(error.headers)


def _lower(headers: Any) -> dict[str, str]:
    return {key.lower(): value for key, value in headers.items()}


# The web process under test and the port it reaches PostgreSQL through (the proxy's): set by
# the `web` fixture.
_WEB: dict[str, int] = {}


def web_connections() -> int:
    """The web process's open connections to PostgreSQL: its own sockets to the proxy that are
    still established, read from the kernel. pg_stat_activity would count the backends of
    connections already closed until PostgreSQL has reaped them, late on a loaded machine (a
    fresh-clone run saw 3 for one request at a time)."""
    try:
        sockets = psutil.Process(_WEB["pid"]).net_connections(kind="tcp")
    except psutil.NoSuchProcess:
        return 0
    return sum(1 for c in sockets if c.raddr and c.raddr.port == _WEB["port"]
               and c.status == psutil.CONN_ESTABLISHED)


@contextlib.contextmanager
def peak_of(count: Callable[[], int]) -> Iterator[list[int]]:
    """Samples `count` every 20 ms while the block runs; yields [the peak]."""
    peak = [0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.02):
            peak[0] = max(peak[0], count())

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield peak
    finally:
        stop.set()
        thread.join()
        peak[0] = max(peak[0], count())


@pytest.fixture
def web_env() -> dict[str, str]:
    return {}


@pytest.fixture
def proxy(transactional_db: None) -> Iterator[Proxy]:
    db = connection.settings_dict
    forwarder = Proxy((db["HOST"] or "127.0.0.1", int(db["PORT"] or 5432)))
    forwarder.start()
    yield forwarder
    forwarder.stop()


@pytest.fixture
def web(transactional_db: None, data_dir: Path, tmp_path: Path, proxy: Proxy,
        web_env: dict[str, str]) -> Iterator[str]:
    """One uvicorn, as `manage.py standalone` starts it, on the test database through the
    proxy; yields its base URL."""
    db = connection.settings_dict
    url = (f"postgres://{db['USER']}@127.0.0.1:{proxy.port}/{db['NAME']}"
           f"?application_name={APP_NAME}")
    env = system_env(data_dir) | {"DATABASE_URL": url} | web_env
    env.pop("INFRAOPS_PROCESS", None)
    port = free_port()
    log_path = tmp_path / "web.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "infraops.project.asgi:application",
             "--host", "127.0.0.1", "--port", str(port), "--no-access-log"],
            env=env, cwd=settings.BASE_DIR, stdout=log, stderr=subprocess.STDOUT)
        _WEB.update(pid=process.pid, port=proxy.port)
        try:
            _wait_for(f"http://127.0.0.1:{port}/healthz", [process])
            yield f"http://127.0.0.1:{port}"
        finally:
            stop_processes([process])
            sys.stdout.write(f"--- web log (tail) ---\n{log_path.read_text()[-4000:]}")


@pytest.fixture
def browser(web: str, example_target: Target) -> Browser:
    user = UserFactory.create(username="pat", roles=["engineer"])
    person = Browser(web)
    person.sign_in(user.username)
    return person


PAGES = ("/", "/targets/tiny-serving/", "/reviews/")


def _fetch_ok(browser: Browser, n: int) -> int:
    return browser.get(PAGES[n % len(PAGES)])[0]


def _load(browser: Browser) -> tuple[int, int]:
    """300 sequential, then 50 concurrent clients (4 requests each): the peak count of the web
    process's connections during each."""
    with peak_of(web_connections) as sequential:
        statuses = [_fetch_ok(browser, n) for n in range(300)]
    assert statuses == [200] * 300
    with peak_of(web_connections) as concurrent, ThreadPoolExecutor(50) as pool:
        statuses = list(pool.map(lambda n: _fetch_ok(browser, n), range(50 * 4)))
    assert statuses == [200] * 200
    # The count sees the connections at all (a count that read nothing would pass the rest).
    assert concurrent[0] >= 1, "no connection of the web process was seen during the load"
    return sequential[0], concurrent[0]


def _settles_at(count: Callable[[], int], most: int, within: float = 5.0) -> int:
    deadline = time.monotonic() + within
    while (now := count()) > most and time.monotonic() < deadline:
        time.sleep(0.1)
    return now


@pytest.mark.e2e
@pytest.mark.parametrize("web_env", [NO_POOL])
def test_300_sequential_and_50_concurrent_requests_leave_no_connection_open(
    browser: Browser,
) -> None:
    sequential, concurrent = _load(browser)
    assert sequential <= 2  # one request at a time: its own connection, closed at its end
    assert concurrent <= 50 + 2  # at most one per request in flight
    # Drops back: nothing is kept once the requests end (31 stayed open over a minute before).
    assert _settles_at(web_connections, 0) == 0


@pytest.mark.e2e
@pytest.mark.parametrize("web_env", [WITH_POOL])
def test_with_a_pool_the_count_stays_within_its_size(browser: Browser) -> None:
    sequential, concurrent = _load(browser)
    assert sequential <= POOL_SIZE and concurrent <= POOL_SIZE, (sequential, concurrent)
    assert _settles_at(web_connections, POOL_SIZE) <= POOL_SIZE


@pytest.mark.e2e
@pytest.mark.parametrize("web_env", [{}, NO_POOL], ids=["pool", "no-pool"])
def test_a_database_that_refuses_gives_the_503_page_and_the_site_recovers(
    browser: Browser, proxy: Proxy,
) -> None:
    assert browser.get("/")[0] == 200
    proxy.stop()  # refuses new connections and cuts the pooled ones
    try:
        for page in ("/", "/targets/tiny-serving/", "/healthz"):
            status, body, headers = browser.get(page)
            assert status == 503, (page, body[:500])
            assert DB_DOWN_TEXT in body
            assert "Traceback" not in body and "OperationalError" not in body
            assert headers["retry-after"] == "5"
    finally:
        proxy.start()
    deadline = time.monotonic() + 15
    status = 0
    while time.monotonic() < deadline:
        status, body, _ = browser.get("/")
        if status == 200:
            break
        assert status == 503, body[:500]
        time.sleep(0.5)
    assert status == 200  # by itself: the process was not restarted
    assert "tiny-serving" in browser.get("/targets/tiny-serving/")[1]


def _terminate_web_backends() -> int:
    with psycopg.connect(dbname="postgres", host="127.0.0.1", user="postgres",
                         autocommit=True) as admin:
        row = admin.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                            "WHERE application_name = %s AND datname = %s",
                            [APP_NAME, connection.settings_dict["NAME"]]).fetchone()
    return int(row[0]) if row else 0


@pytest.mark.e2e
@pytest.mark.parametrize("web_env", [NO_POOL])
def test_terminated_backends_cost_nothing_to_the_next_requests(browser: Browser) -> None:
    with ThreadPoolExecutor(10) as pool:
        futures = [pool.submit(browser.get, "/targets/tiny-serving/") for _ in range(30)]
        time.sleep(0.05)
        _terminate_web_backends()  # mid-load: some requests lose their connection
        statuses = [future.result()[0] for future in futures]
    assert set(statuses) <= {200, 503}  # never a 500
    assert [_fetch_ok(browser, n) for n in range(6)] == [200] * 6


@pytest.mark.e2e
@pytest.mark.parametrize("web_env", [WITH_POOL])
def test_with_a_pool_terminated_backends_are_replaced_by_themselves(browser: Browser) -> None:
    with ThreadPoolExecutor(10) as pool:  # fill the pool
        assert set(pool.map(lambda n: _fetch_ok(browser, n), range(30))) == {200}
    assert _terminate_web_backends() >= 1
    deadline = time.monotonic() + 20
    statuses: list[int] = []
    while time.monotonic() < deadline:
        statuses.append(_fetch_ok(browser, len(statuses)))
        if statuses[-3:] == [200] * 3:
            break
    assert set(statuses) <= {200, 503}, statuses  # a wait or the 503 page, never a 500
    assert statuses[-3:] == [200] * 3, statuses


# --- in-process: every layer that can meet the database ------------------------------------


def _refusing_view(request: HttpRequest) -> HttpResponse:
    raise OperationalError('connection to server at "127.0.0.1", port 1 failed: Connection '
                           "refused")


def _closed_view(request: HttpRequest) -> HttpResponse:
    raise InterfaceError("connection already closed")


def _other_error_view(request: HttpRequest) -> HttpResponse:
    raise ValueError("not a database error")


urlpatterns = [
    path("refused/", _refusing_view),
    path("closed/", _closed_view),
    path("other/", _other_error_view),
    path("healthz", _refusing_view),
]


class _RefusingMiddleware:
    """A middleware meeting a refusing database, as LoginRequiredMiddleware does when it reads
    the session's user."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path == "/middleware/":
            raise OperationalError("the database system is shutting down")
        return self.get_response(request)


def _client(user: User) -> Client:
    client = Client(raise_request_exception=False)
    client.force_login(user)
    return client


@pytest.mark.urls("tests.infraops.test_connections")
@pytest.mark.parametrize("page", ["/refused/", "/closed/", "/healthz"])
def test_a_view_meeting_a_database_error_gives_the_503_page(page: str, engineer: User) -> None:
    response = _client(engineer).get(page)
    assert response.status_code == 503
    body = response.content.decode()
    assert DB_DOWN_TEXT in body and "Traceback" not in body and "refused" not in body
    assert response["Retry-After"] == "5"
    assert response["Content-Security-Policy"].startswith("default-src 'self'")


@pytest.mark.urls("tests.infraops.test_connections")
def test_another_error_is_still_a_500(engineer: User) -> None:
    response = _client(engineer).get("/other/")
    assert response.status_code == 500


def test_a_middleware_meeting_a_database_error_gives_the_503_page(
    engineer: User, settings: Any,
) -> None:
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, "tests.infraops.test_connections."
                                                 "_RefusingMiddleware"]
    settings.DEBUG = True  # not even DEBUG shows a traceback for this
    response = _client(engineer).get("/middleware/")
    assert response.status_code == 503
    assert DB_DOWN_TEXT in response.content.decode()
    assert "Traceback" not in response.content.decode()
