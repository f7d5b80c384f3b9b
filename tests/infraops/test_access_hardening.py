"""Access hardening, each through the real entry point: websockets through
infraops.project.asgi.application (revoked sessions and roles, Origin with scheme and port, frame
limits both ways), the sign-in throttle through the test client, the SECRET_KEY rule through
`manage.py`, the audit log's TRUNCATE trigger in PostgreSQL, and the budget minimums through
the admin's goal form."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings as django_settings
from django.contrib.auth.models import User
from django.contrib.sessions.models import Session
from django.db import DatabaseError, connection, transaction
from django.test import Client

from agents.events import run_event
from agents.models import AgentRun
from infraops import consumers as consumers_module
from infraops.models import AuditEntry, Boundary, Goal, Target
from infraops.project import login as throttle
from infraops.project.asgi import application, origin_allowed
from infraops.services.audit import audit_record
from tests.factories import AgentRunFactory

TIMEOUT = 15  # generous: a first socket of a session warms templates and connections
CLOSE_WITHIN = 5  # seconds from logout or role removal to the close
ORIGIN = (b"origin", b"http://localhost")
PREFIX = "InfraOps configuration error:"
sockets = pytest.mark.django_db(transaction=True)


def run_async(scenario: Callable[[], Awaitable[Any]]) -> Any:
    return async_to_sync(scenario)()


def signed_in(user: User) -> tuple[Client, list[tuple[bytes, bytes]]]:
    client = Client()
    client.force_login(user)
    return client, [ORIGIN, (b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode())]


def seqs(html: str) -> list[int]:
    return [int(n) for n in re.findall(r'data-seq="(\d+)"', html)]


@pytest.fixture
def run(example_goal: Goal, engineer: User, close_thread_connections: None) -> AgentRun:
    made = AgentRunFactory.create(goal=example_goal, started_by=engineer)
    for message in ("Run started.", "Step 1: batch_size 4."):
        run_event(run_id=made.pk, kind="status", message=message)
    return made


async def open_socket(run_id: int, headers: list[tuple[bytes, bytes]]) -> WebsocketCommunicator:
    communicator = WebsocketCommunicator(application, f"/ws/runs/{run_id}/", headers=headers)
    connected, code = await communicator.connect(timeout=TIMEOUT)
    assert connected, code
    return communicator


async def closed_within(communicator: WebsocketCommunicator, seconds: float) -> tuple[float, Any]:
    """Seconds until the server closed the socket, and the close code (frames before the
    close are skipped)."""
    start = time.monotonic()
    while True:
        left = seconds - (time.monotonic() - start)
        assert left > 0, "the socket was not closed in time"
        output = await communicator.receive_output(timeout=left)
        if output["type"] == "websocket.close":
            return time.monotonic() - start, output.get("code")


# --- 1. sockets end with the session or the role ------------------------------------------


@sockets
def test_a_socket_closes_within_5_s_of_logout(run: AgentRun, viewer: User) -> None:
    client, headers = signed_in(viewer)

    async def scenario() -> tuple[float, Any]:
        communicator = await open_socket(run.pk, headers)
        await communicator.send_json_to({"after": 0})
        assert seqs(await communicator.receive_from(timeout=TIMEOUT)) == [1, 2]
        await sync_to_async(client.post)("/accounts/logout/")  # the real sign-out
        result = await closed_within(communicator, CLOSE_WITHIN)
        await communicator.disconnect()
        return result

    elapsed, code = run_async(scenario)

    assert elapsed < CLOSE_WITHIN
    assert code == consumers_module.CLOSE_SIGNED_OUT
    assert not Session.objects.filter(session_key=client.cookies["sessionid"].value).exists()


@sockets
def test_a_socket_closes_within_5_s_of_losing_its_last_role(run: AgentRun, viewer: User) -> None:
    _, headers = signed_in(viewer)

    async def scenario() -> tuple[float, Any]:
        communicator = await open_socket(run.pk, headers)
        await sync_to_async(viewer.target_memberships.all().delete)()
        await sync_to_async(viewer.groups.clear)()
        result = await closed_within(communicator, CLOSE_WITHIN)
        await communicator.disconnect()
        return result

    elapsed, code = run_async(scenario)

    assert elapsed < CLOSE_WITHIN
    assert code == consumers_module.CLOSE_FORBIDDEN


@sockets
def test_the_reviews_socket_closes_after_logout_too(viewer: User,
                                                    close_thread_connections: None) -> None:
    client, headers = signed_in(viewer)

    async def scenario() -> tuple[float, Any]:
        communicator = WebsocketCommunicator(application, "/ws/reviews/", headers=headers)
        assert (await communicator.connect(timeout=TIMEOUT))[0]
        await communicator.receive_from(timeout=TIMEOUT)  # the count, at once
        await sync_to_async(client.logout)()
        result = await closed_within(communicator, CLOSE_WITHIN)
        await communicator.disconnect()
        return result

    elapsed, code = run_async(scenario)

    assert elapsed < CLOSE_WITHIN
    assert code == consumers_module.CLOSE_SIGNED_OUT


@sockets
def test_a_socket_whose_user_keeps_session_and_role_stays_open_and_streaming(
    run: AgentRun, viewer: User
) -> None:
    """The control of the two tests above: the re-checks close nothing that may stay."""
    _, headers = signed_in(viewer)
    append = sync_to_async(run_event)

    async def scenario() -> tuple[bool, list[int]]:
        communicator = await open_socket(run.pk, headers)
        await communicator.send_json_to({"after": 2})
        quiet = await communicator.receive_nothing(timeout=consumers_module.RECHECK_SECONDS * 2)
        await append(run_id=run.pk, kind="step", message="Step 2.")
        html = await communicator.receive_from(timeout=TIMEOUT)
        await communicator.disconnect()
        return quiet, seqs(str(html))

    quiet, rows = run_async(scenario)

    assert quiet  # no close across two re-checks
    assert rows == [3]


@sockets
def test_frames_in_a_burst_share_one_check_of_session_and_role(
    run: AgentRun, viewer: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each frame is sent within SEND_RECHECK_SECONDS of a passing check, not after a check
    of its own: a burst of rows costs the database no session and role reads per frame."""
    _, headers = signed_in(viewer)
    checks: list[float] = []
    real = consumers_module.GuardedConsumer._access

    def counted(self: Any) -> int | None:
        checks.append(time.monotonic())
        return real(self)

    monkeypatch.setattr(consumers_module.GuardedConsumer, "_access", counted)
    append = sync_to_async(run_event)

    async def scenario() -> list[int]:
        communicator = await open_socket(run.pk, headers)
        await communicator.send_json_to({"after": 2})
        got: list[int] = []
        for n in range(20):
            await append(run_id=run.pk, kind="step", message=f"Step {n}.")
            got += seqs(str(await communicator.receive_from(timeout=TIMEOUT)))
        await communicator.disconnect()
        return got

    began = time.monotonic()
    rows = run_async(scenario)
    took = time.monotonic() - began

    assert rows == list(range(3, 23))
    # The connect's check, the watch's every RECHECK_SECONDS and at most one a second more.
    allowed = 1 + took / consumers_module.RECHECK_SECONDS + \
        took / consumers_module.SEND_RECHECK_SECONDS + 1
    assert len(checks) <= allowed, (len(checks), took)


# --- 2. Origin: scheme, host and port ------------------------------------------------------


def scope(origin: str | None, host: str | None = "ops.example.com:8000",
          scheme: str = "ws", **extra: Any) -> dict[str, Any]:
    headers = [] if origin is None else [(b"origin", origin.encode())]
    if host is not None:
        headers.append((b"host", host.encode()))
    return {"type": "websocket", "scheme": scheme, "headers": headers, **extra}


@pytest.fixture
def hosts(settings: Any) -> None:
    settings.ALLOWED_HOSTS = ["ops.example.com", "localhost"]
    settings.CSRF_TRUSTED_ORIGINS = ["https://console.example.com", "https://*.corp.example"]


@pytest.mark.parametrize(("origin", "allowed"), [
    ("http://ops.example.com:8000", True),  # the page's own origin
    ("HTTP://OPS.example.com:8000", True),
    ("http://ops.example.com:9999", False),  # another port of the same host
    ("http://ops.example.com", False),  # port 80 is another origin
    ("https://ops.example.com:8000", False),  # another scheme
    ("http://evil.example:8000", False),
    ("http://ops.example.com.evil.example:8000", False),
    ("https://console.example.com", True),  # CSRF_TRUSTED_ORIGINS
    ("https://console.example.com:443", True),
    ("http://console.example.com", False),
    ("https://console.example.com:8443", False),
    ("https://a.corp.example", True),
    ("https://corp.example.evil", False),
    ("null", False),
    ("", False),
    (None, False),
    ("http://ops.example.com:8000/path", False),
    ("http://user@ops.example.com:8000", False),
    ("http://ops.example.com:99999", False),
    ("javascript:alert(1)", False),
])
def test_the_origin_must_match_scheme_host_and_port(hosts: None, origin: str | None,
                                                    allowed: bool) -> None:
    assert origin_allowed(scope(origin)) is allowed


def test_the_own_origin_needs_an_allowed_host_header(hosts: None) -> None:
    assert origin_allowed(scope("http://evil.example:8000", host="evil.example:8000")) is False


def test_behind_tls_the_own_origin_is_https(hosts: None) -> None:
    assert origin_allowed(scope("https://ops.example.com", host="ops.example.com",
                                scheme="wss"))
    assert not origin_allowed(scope("http://ops.example.com", host="ops.example.com",
                                    scheme="wss"))


def test_without_a_host_header_the_server_address_is_the_own_origin(hosts: None) -> None:
    assert origin_allowed(scope("http://localhost:8000", host=None, server=("localhost", 8000)))
    assert not origin_allowed(scope("http://localhost:8001", host=None,
                                    server=("localhost", 8000)))


@sockets
@pytest.mark.parametrize(("origin", "connected"), [
    (b"http://localhost:8000", True), (b"http://localhost:8001", False),
    (b"https://localhost:8000", False),
])
def test_a_socket_from_another_port_or_scheme_is_refused_even_with_a_session(
    run: AgentRun, viewer: User, origin: bytes, connected: bool
) -> None:
    _, headers = signed_in(viewer)
    headers = [(b"origin", origin), (b"host", b"localhost:8000"), headers[1]]

    async def scenario() -> bool:
        communicator = WebsocketCommunicator(application, f"/ws/runs/{run.pk}/", headers=headers)
        ok, _ = await communicator.connect(timeout=TIMEOUT)
        if ok:
            await communicator.disconnect()
        return bool(ok)

    assert run_async(scenario) is connected


# --- 3. client frames: capped, malformed, nested -------------------------------------------


@sockets
@pytest.mark.parametrize("frame", [
    {"text_data": " " * (consumers_module.MAX_CLIENT_FRAME - 12) + '{"after": 1}' + " "},
    {"text_data": "é" * (consumers_module.MAX_CLIENT_FRAME // 2 + 1)},  # counted in bytes
    {"bytes_data": b"x" * (consumers_module.MAX_CLIENT_FRAME + 1)},
    {"text_data": "[" * (16 * 1024 * 1024)},  # the 16 MiB that used to be read and parsed
])
def test_a_client_frame_over_64_kib_closes_the_socket_with_1009(
    run: AgentRun, viewer: User, frame: dict[str, Any]
) -> None:
    _, headers = signed_in(viewer)

    async def scenario() -> Any:
        communicator = await open_socket(run.pk, headers)
        await communicator.send_to(**frame)
        output = await communicator.receive_output(timeout=TIMEOUT)
        await communicator.disconnect()
        return output

    assert run_async(scenario) == {"type": "websocket.close", "code": 1009}


@sockets
def test_a_frame_of_exactly_64_kib_is_read(run: AgentRun, viewer: User) -> None:
    _, headers = signed_in(viewer)
    text = '{"after": 1}'
    text += " " * (consumers_module.MAX_CLIENT_FRAME - len(text))

    async def scenario() -> str:
        communicator = await open_socket(run.pk, headers)
        await communicator.send_to(text_data=text)
        html = await communicator.receive_from(timeout=TIMEOUT)
        await communicator.disconnect()
        return str(html)

    assert seqs(run_async(scenario)) == [2]


@sockets
@pytest.mark.parametrize("malformed", [
    "[" * 60000,  # deeper than the JSON parser's recursion: it used to kill the handler
    '{"a":' * 10000 + "1" + "}" * 10000,
    '{"after": ' + "[" * 30000 + "]" * 30000 + "}",
    '{"after": ' + "9" * 5000 + "}",  # past Python's int-from-text limit
    '{"after": 1e400}', '{"after": -5e400}', '{"after": true}', '{"after": null}',
    "\ud800", "\x00", '{"after": 1', " ",
])
def test_malformed_or_deeply_nested_json_is_ignored_and_the_socket_still_answers(
    run: AgentRun, viewer: User, malformed: str
) -> None:
    _, headers = signed_in(viewer)

    async def scenario() -> tuple[bool, str]:
        communicator = await open_socket(run.pk, headers)
        await communicator.send_to(text_data=malformed)
        silent = await communicator.receive_nothing(timeout=0.5)
        await communicator.send_json_to({"after": 1})
        html = await communicator.receive_from(timeout=TIMEOUT)
        await communicator.disconnect()
        return silent, str(html)

    silent, html = run_async(scenario)

    assert silent
    assert seqs(html) == [2]


@sockets
def test_an_after_beyond_any_row_number_sends_nothing_and_breaks_nothing(
    run: AgentRun, viewer: User
) -> None:
    _, headers = signed_in(viewer)

    async def scenario() -> tuple[bool, str]:
        communicator = await open_socket(run.pk, headers)
        await communicator.send_json_to({"after": 2**80})
        silent = await communicator.receive_nothing(timeout=0.5)
        await communicator.send_json_to({"after": -7})  # below 0: from the start
        html = await communicator.receive_from(timeout=TIMEOUT)
        await communicator.disconnect()
        return silent, str(html)

    silent, html = run_async(scenario)

    assert silent
    assert seqs(html) == [1, 2]


# --- 4. server frames: at most 256 KiB ------------------------------------------------------


async def all_frames(communicator: WebsocketCommunicator,
                     until: Callable[[str], bool]) -> list[str]:
    """Frames up to the one `until` accepts, each waited for with a generous deadline (a
    half-second pause between frames ended an earlier version early under a loaded suite),
    then none more."""
    frames = [str(await communicator.receive_from(timeout=TIMEOUT))]
    while not until(frames[-1]):
        frames.append(str(await communicator.receive_from(timeout=TIMEOUT)))
    assert await communicator.receive_nothing(timeout=0.5), "a frame after the last one"
    return frames


def fetch_frame(frame: str) -> bool:
    return frame.startswith("<template data-live-fetch")


@sockets
def test_many_rows_go_in_several_frames_each_under_256_kib(run: AgentRun, viewer: User) -> None:
    for n in range(150):  # ~6 KiB each, about 900 KiB together
        run_event(run_id=run.pk, kind="status", message=f"row {n} " + "x" * 6000)
    _, headers = signed_in(viewer)

    async def scenario() -> list[str]:
        communicator = await open_socket(run.pk, headers)
        await communicator.send_json_to({"after": 0})
        frames = await all_frames(communicator, until=lambda frame: 152 in seqs(frame))
        await communicator.disconnect()
        return frames

    frames = run_async(scenario)

    assert len(frames) > 1
    assert all(len(f.encode()) <= consumers_module.MAX_SERVER_FRAME for f in frames)
    assert [n for f in frames for n in seqs(f)] == list(range(1, 153))
    assert not any("data-live-fetch" in f for f in frames)


@sockets
def test_a_row_too_big_for_a_frame_makes_the_page_fetch_over_http(run: AgentRun,
                                                                  viewer: User) -> None:
    big = run_event(run_id=run.pk, kind="status", message="huge " + "y" * (783 * 1024))
    append = sync_to_async(run_event)
    client, headers = signed_in(viewer)

    async def scenario() -> tuple[list[str], bool, str]:
        communicator = await open_socket(run.pk, headers)
        await communicator.send_json_to({"after": 0})
        frames = await all_frames(communicator, until=fetch_frame)
        # The page fetched over HTTP and says where it is now; nothing comes twice, and
        # the socket streams what is new again.
        await communicator.send_json_to({"after": big.seq})
        quiet = await communicator.receive_nothing(timeout=0.5)
        await append(run_id=run.pk, kind="status", message="after the big one")
        later = str(await communicator.receive_from(timeout=TIMEOUT))
        await communicator.disconnect()
        return frames, quiet, later

    frames, quiet, later = run_async(scenario)

    assert all(len(f.encode()) <= consumers_module.MAX_SERVER_FRAME for f in frames)
    assert [n for f in frames[:-1] for n in seqs(f)] == [1, 2]
    fetch = frames[-1]
    assert fetch.startswith("<template data-live-fetch")
    assert 'data-after="2"' in fetch and f'data-upto="{big.seq}"' in fetch
    url = re.search(r'data-url="([^"]+)"', fetch)
    assert url and url.group(1) == f"/runs/{run.pk}/"
    assert 'data-refresh="run-status' in fetch
    assert quiet
    assert seqs(later) == [big.seq + 1]
    # What the page fetches (static/js/live-log.js): the page with the rows after 2.
    page = client.get(url.group(1), {"after": "2"})
    assert page.status_code == 200
    assert f'data-seq="{big.seq}"' in page.content.decode()


@sockets
def test_a_page_that_could_not_fetch_is_not_sent_the_fetch_frame_again(
    run: AgentRun, viewer: User
) -> None:
    run_event(run_id=run.pk, kind="status", message="z" * (300 * 1024))
    _, headers = signed_in(viewer)

    async def scenario() -> tuple[list[str], bool]:
        communicator = await open_socket(run.pk, headers)
        await communicator.send_json_to({"after": 2})
        frames = await all_frames(communicator, until=fetch_frame)
        await communicator.send_json_to({"after": 2})  # still at 2: the fetch failed
        quiet = await communicator.receive_nothing(timeout=0.5)
        await communicator.disconnect()
        return frames, quiet

    frames, quiet = run_async(scenario)

    assert len(frames) == 1 and frames[0].startswith("<template data-live-fetch")
    assert quiet  # no fetch loop between the page and the socket


# --- 5. the sign-in throttle -----------------------------------------------------------------


@pytest.fixture
def address() -> Iterator[str]:
    """A client address of this test alone; its counts (and its usernames') are cleared."""
    made = f"198.51.100.{os.getpid() % 250 + 1}"
    yield made
    for name in ("vic", "erin", *(f"ghost{n}" for n in range(20))):
        throttle.reset(name, made)


def sign_in(username: str, password: str, address: str, path: str = "/accounts/login/") -> Any:
    return Client(REMOTE_ADDR=address).post(path, {"username": username, "password": password})


LOCKED = "sign-in is locked for 15 minutes"


@pytest.mark.django_db
def test_five_failures_for_a_username_lock_it_even_with_the_right_password(
    fast_password_hashing: None, viewer: User, engineer: User, address: str
) -> None:
    for _ in range(4):
        response = sign_in("vic", "wrong", address)
        assert response.status_code == 200
        assert LOCKED not in response.content.decode()
    fifth = sign_in("vic", "wrong", address)
    right = sign_in("vic", "correct horse battery", address)

    assert fifth.status_code == 429 and LOCKED in fifth.content.decode()
    assert right.status_code == 429 and LOCKED in right.content.decode()
    assert "_auth_user_id" not in right.client.session
    # Another user from the same address is not locked by vic's failures.
    assert sign_in("erin", "correct horse battery", address).status_code == 302


@pytest.mark.django_db
@pytest.mark.parametrize("look_alike", ["\uff56ic", "v\uff49c", "VIC", " vic ", "\u1d5bic"],
                         ids=["fullwidth-v", "fullwidth-i", "upper", "spaces", "modifier-v"])
def test_a_locked_name_stays_locked_under_every_spelling_of_it(
    fast_password_hashing: None, viewer: User, address: str, look_alike: str
) -> None:
    """Issue 28: five failures locked `norole`, and `\uff4eorole` (fullwidth n, which Django
    normalises to the same account) signed in with the right password."""
    for _ in range(5):
        sign_in("vic", "wrong", address)

    right = sign_in(look_alike, "correct horse battery", address)

    assert right.status_code == 429 and LOCKED in right.content.decode()
    assert "_auth_user_id" not in right.client.session


@pytest.mark.django_db
def test_failures_under_look_alike_names_count_together(
    fast_password_hashing: None, viewer: User, address: str
) -> None:
    for name in ("vic", "\uff56ic", "VIC", "v\uff49c"):
        assert sign_in(name, "wrong", address).status_code == 200

    fifth = sign_in("\uff56\uff49\uff43", "wrong", address)

    assert fifth.status_code == 429 and LOCKED in fifth.content.decode()
    assert sign_in("vic", "correct horse battery", address).status_code == 429


@pytest.mark.django_db
def test_a_success_before_the_limit_clears_the_count(fast_password_hashing: None, viewer: User,
                                                     address: str) -> None:
    for _ in range(4):
        sign_in("vic", "wrong", address)
    assert sign_in("vic", "correct horse battery", address).status_code == 302
    for _ in range(4):
        assert sign_in("vic", "wrong", address).status_code == 200

    assert sign_in("vic", "correct horse battery", address).status_code == 302


@pytest.mark.django_db
def test_twenty_failures_from_an_address_lock_it_for_every_username(
    fast_password_hashing: None, viewer: User, address: str
) -> None:
    for n in range(20):
        sign_in(f"ghost{n}", "wrong", address)

    locked = sign_in("vic", "correct horse battery", address)
    elsewhere = sign_in("vic", "correct horse battery", "192.0.2.99")
    throttle.reset("vic", "192.0.2.99")

    assert locked.status_code == 429 and LOCKED in locked.content.decode()
    assert elsewhere.status_code == 302


@pytest.mark.django_db
def test_the_lock_ends_after_the_lockout(fast_password_hashing: None, viewer: User,
                                         address: str, settings: Any) -> None:
    settings.LOGIN_LOCKOUT_SECONDS = 1
    for _ in range(5):
        sign_in("vic", "wrong", address)
    assert sign_in("vic", "correct horse battery", address).status_code == 429
    time.sleep(2.1)

    assert sign_in("vic", "correct horse battery", address).status_code == 302


@pytest.mark.django_db
def test_the_admin_login_is_throttled_too(fast_password_hashing: None, engineer: User,
                                          address: str) -> None:
    for _ in range(5):
        sign_in("erin", "wrong", address, "/admin/login/")

    response = sign_in("erin", "correct horse battery", address, "/admin/login/")

    assert LOCKED in response.content.decode()
    assert "_auth_user_id" not in response.client.session


def test_the_counts_are_kept_in_redis_shared_by_every_web_process() -> None:
    login: dict[str, Any] = django_settings.CACHES["login"]
    assert login["BACKEND"].endswith("RedisCache")
    assert login["LOCATION"] == django_settings.REDIS_URL


# --- 6. SECRET_KEY ---------------------------------------------------------------------------


def manage(*args: str, **overrides: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("SECRET_KEY", "DEBUG", "PYTEST_VERSION", "INFRAOPS_DATA")}
    return subprocess.run([sys.executable, "manage.py", *args], cwd=django_settings.BASE_DIR,
                          env=env | overrides, capture_output=True, text=True, timeout=120)


def test_outside_debug_without_a_secret_key_start_up_stops_with_one_sentence(
    tmp_path: Path
) -> None:
    result = manage("check", INFRAOPS_DATA=str(tmp_path), DEBUG="false")

    assert result.returncode == 1, result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith(PREFIX)]
    assert len(errors) == 1, result.stderr
    assert "SECRET_KEY is not set" in errors[0]
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("how", ["env", "debug", "key file"])
def test_a_secret_key_a_key_file_or_debug_lets_it_start(tmp_path: Path, how: str) -> None:
    overrides = {"INFRAOPS_DATA": str(tmp_path), "DEBUG": "false"}
    if how == "env":
        overrides["SECRET_KEY"] = "k" * 60
    elif how == "debug":
        overrides["DEBUG"] = "true"
    else:
        (tmp_path / "secret_key").write_text("f" * 60)
    code = "from django.conf import settings; print(settings.SECRET_KEY)"

    result = manage("shell", "-c", code, **overrides)

    assert result.returncode == 0, result.stderr
    key = result.stdout.strip().splitlines()[-1]
    assert key == {"env": "k" * 60, "key file": "f" * 60}.get(how, key)


def test_standalone_makes_its_key_file_on_its_first_start(tmp_path: Path) -> None:
    with socket.socket() as busy:  # standalone stops at once on a port in use, after settings
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        result = manage("standalone", "--port", port, INFRAOPS_DATA=str(tmp_path),
                        DEBUG="false")

    assert "is in use" in result.stderr, result.stderr
    assert PREFIX not in result.stderr
    key_file = tmp_path / "secret_key"
    assert len(key_file.read_text().strip()) >= 50
    assert key_file.stat().st_mode & 0o777 == 0o600


def test_the_test_session_runs_with_a_generated_key_not_the_development_one() -> None:
    assert django_settings.SECRET_KEY != "django-insecure-infraops-development-key"
    assert len(django_settings.SECRET_KEY) >= 50


# --- 7. the audit log refuses TRUNCATE ------------------------------------------------------


@pytest.mark.django_db
def test_truncate_of_the_audit_log_is_refused(engineer: User, example_target: Target) -> None:
    audit_record(actor=engineer, action="test.entry", obj=example_target)
    before = AuditEntry.objects.count()

    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic(), \
            connection.cursor() as cursor:
        # As in any database but a test one (see the migration): no 'allow'.
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # the insert's FK checks, done
        cursor.execute("SELECT set_config('infraops.audit_truncate', '', true)")
        cursor.execute("TRUNCATE infraops_auditentry CASCADE")

    assert AuditEntry.objects.count() == before >= 1


@pytest.mark.django_db
@pytest.mark.parametrize("sql", ["DELETE FROM infraops_auditentry",
                                 "UPDATE infraops_auditentry SET action = 'x'"])
def test_delete_and_update_stay_refused(engineer: User, example_target: Target,
                                        sql: str) -> None:
    audit_record(actor=engineer, action="test.entry", obj=example_target)

    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic(), \
            connection.cursor() as cursor:
        cursor.execute(sql)


@pytest.mark.django_db
def test_only_test_databases_may_truncate_it_for_the_flush_between_tests() -> None:
    from importlib import import_module

    migration = import_module("infraops.migrations.0009_audit_refuses_truncate")
    executed: list[str] = []

    class Cursor:
        def __enter__(self) -> Cursor:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def execute(self, sql: str) -> None:
            executed.append(sql)

    def editor(name: str) -> Any:
        conn = SimpleNamespace(settings_dict={"NAME": name}, cursor=Cursor)
        return SimpleNamespace(connection=conn, quote_name=lambda n: f'"{n}"')

    migration.allow_flush_in_test_databases(None, editor("infraops"))
    assert executed == []
    migration.allow_flush_in_test_databases(None, editor("test_infraops"))
    assert any("ALTER DATABASE \"test_infraops\"" in sql for sql in executed)
    with connection.cursor() as cursor:
        cursor.execute("SELECT tgtype FROM pg_trigger WHERE tgname = 'infraops_audit_no_truncate'")
        assert cursor.fetchone() is not None


# --- 8. budgets: no negative, no zero ---------------------------------------------------------


@pytest.fixture
def editor(client: Client, engineer: User) -> Client:
    client.force_login(engineer)
    return client


@pytest.mark.django_db
@pytest.mark.parametrize(("field", "value", "message"), [
    ("max_cost_usd", "-5", "A cost budget is at least $0.01"),
    ("max_cost_usd", "-0.01", "A cost budget is at least $0.01"),
    ("max_cost_usd", "0", "A cost budget is at least $0.01"),
    # A negative budget is answered with the budget's own floor, not the form field's 0
    # ("greater than or equal to 0" was unclear, and wrong: 0 is refused too).
    ("max_tokens", "-1", "A token budget is at least 1 token."),
    ("max_tokens", "0", "A token budget is at least 1 token."),
    ("max_steps", "-3", "A step budget is at least 1 step."),
    ("max_steps", "0", "A step budget is at least 1 step."),
    ("max_experiments", "0", "An experiment budget is at least 1 experiment."),
    ("max_experiments", "-3", "An experiment budget is at least 1 experiment."),
    ("max_wall_minutes", "0", "A wall-time budget is at least 1 minute."),
    ("max_wall_minutes", "-1", "A wall-time budget is at least 1 minute."),
    ("max_diff_lines", "0", "A diff budget is at least 1 changed line."),
    ("max_diff_lines", "-400", "A diff budget is at least 1 changed line."),
    ("max_tokens", "99999999999", "less than or equal to"),
    ("max_experiments", "many", "Enter a whole number."),
])
def test_a_negative_or_zero_budget_is_refused_by_the_admin_form(
    editor: Client, example_target: Target, field: str, value: str, message: str
) -> None:
    from tests.infraops.test_admin import new_goal

    response = editor.post("/admin/infraops/goal/add/",
                           new_goal(editor, example_target, **{f"boundary-0-{field}": value}))

    assert response.status_code == 200
    assert message in response.content.decode()
    assert not Goal.objects.exists()
    assert not Boundary.objects.exists()


@pytest.mark.django_db
def test_the_smallest_budgets_are_saved(editor: Client, example_target: Target) -> None:
    from tests.infraops.test_admin import new_goal

    small = {f"boundary-0-{f}": "1" for f in ("max_tokens", "max_steps", "max_experiments",
                                              "max_wall_minutes", "max_diff_lines")}
    fields = new_goal(editor, example_target, **small, **{"boundary-0-max_cost_usd": "0.01"})

    response = editor.post("/admin/infraops/goal/add/", fields, follow=True)

    assert response.status_code == 200
    assert "Goal saved as version 1" in response.content.decode()
    boundary = Boundary.objects.get()
    assert str(boundary.max_cost_usd) == "0.01" and boundary.max_steps == 1

