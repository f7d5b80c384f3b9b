"""The whole system as real processes: uvicorn (HTTP + websockets) and a Celery worker on
the test database and Redis, and Debian's Chromium driven by Playwright."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from playwright.sync_api import Browser, Page

# The review pages' changes, with real commits in InfraOps' clone (test_review_truth.py).
from tests.reviews.conftest import (  # noqa: F401 (fixtures)
    auto_goal,
    commit_on,
    config_change,
    passing_submit,
)

CHROMIUM = "/usr/bin/chromium"


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args: dict[str, Any]) -> dict[str, Any]:
    if not Path(CHROMIUM).exists():
        pytest.fail("Debian's chromium is missing: scripts/setup.sh installs it.")
    return {
        **browser_type_launch_args,
        "executable_path": CHROMIUM,
        # Without these, Chromium keeps dialing out, and this machine has no network.
        "args": ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"],
    }


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def system_env(data_dir: Path) -> dict[str, str]:
    db = connection.settings_dict
    url = f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
    return os.environ | {
        "DATABASE_URL": url,
        "INFRAOPS_DATA": str(data_dir),
        "DJANGO_SETTINGS_MODULE": "infraops.project.settings",
        "PYTHONUNBUFFERED": "1",
    }


@pytest.fixture
def live_env() -> dict[str, str]:
    """Extra environment for the system's processes (a test overrides this fixture)."""
    return {}


@pytest.fixture
def live_system(transactional_db: None, data_dir: Path, tmp_path: Path,
                live_env: dict[str, str]) -> Iterator[str]:
    """Start web and worker against this test's database; yield the base URL."""
    port = free_port()
    env = system_env(data_dir) | live_env
    logs = {name: (tmp_path / f"{name}.log").open("wb") for name in ("web", "worker")}
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "infraops.project", "worker", "-Q",
             "agent,experiments", "-c", "2", "--loglevel", "INFO", "-n", f"e2e-{port}@%h"],
            env=env, cwd=settings.BASE_DIR, stdout=logs["worker"], stderr=subprocess.STDOUT),
        subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "infraops.project.asgi:application", "--host",
             "127.0.0.1", "--port", str(port)],
            env=env, cwd=settings.BASE_DIR, stdout=logs["web"], stderr=subprocess.STDOUT),
    ]
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_for(f"{base}/healthz", processes)
        yield base
    finally:
        stop_processes(processes)
        for name, handle in logs.items():
            handle.close()
            sys.stdout.write(f"--- {name} log (tail) ---\n")
            sys.stdout.write((tmp_path / f"{name}.log").read_text(errors="replace")[-4000:])


def stop_processes(processes: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM each, then SIGKILL what has not exited within 20 s."""
    for process in processes:
        process.terminate()
    for process in processes:
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()


def _wait_for(url: str, processes: list[subprocess.Popen[bytes]]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in processes):
            raise RuntimeError("a system process exited during start-up (see its log)")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"{url} did not answer within 60 s")


class NetworkSwitch:
    """A page's websockets through a switch, as a dropped network would treat them: `down()`
    cuts every open socket (an abnormal closure, code 1006, as the browser reports a lost
    connection) and refuses new ones; `up()` lets them through again. Chromium's offline mode
    leaves open websockets alone, so it cannot show a page surviving a drop."""

    def __init__(self, page: Any) -> None:
        self.is_up = True
        self.opened = 0  # sockets let through to the server, reconnections included
        self.routes: list[tuple[Any, Any]] = []
        page.route_web_socket(re.compile(r"/ws/"), self._route)

    def _route(self, socket: Any) -> None:
        if not self.is_up:
            socket.close(code=1006, reason="network down")
            return
        self.opened += 1
        self.routes.append((socket, socket.connect_to_server()))

    def down(self) -> None:
        self.is_up = False
        for route, server in self.routes:
            route.close(code=1006, reason="network down")
            server.close()
        self.routes.clear()

    def up(self) -> None:
        self.is_up = True


def signed_in(browser: Browser, live_server: Any, client: Client, user: User) -> Any:
    """A laptop-sized browser context (1280 x 720) signed in as `user`."""
    client.force_login(user)
    session = client.cookies[settings.SESSION_COOKIE_NAME].value
    context = browser.new_context(viewport={"width": 1280, "height": 720})
    context.add_cookies([{"name": settings.SESSION_COOKIE_NAME, "value": session,
                          "url": live_server.url}])
    return context


@pytest.fixture
def desktop(browser: Browser, live_server: Any, client: Client, reviewer: User,
            close_thread_connections: None) -> Iterator[Page]:
    """A reviewer's page in a laptop-sized browser, on the in-process live server."""
    context = signed_in(browser, live_server, client, reviewer)
    yield context.new_page()
    context.close()
