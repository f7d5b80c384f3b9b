"""Fixtures on real PostgreSQL, Redis and git: users with roles, the example target."""

from __future__ import annotations

import atexit
import functools
import hashlib
import importlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import Group, User
from django.db import connections
from django.db.backends.signals import connection_created

from infraops import gitops
from infraops.models import Goal, Target, TargetMembership
from infraops.services.targets import target_add_role_holders, target_register
from tests.factories import GoalFactory
from tests.factories import UserFactory as UserFactory  # re-exported: imported from here too

EXAMPLE = Path(settings.BASE_DIR) / "examples" / "tiny-serving"
DEMO = Path(settings.BASE_DIR) / "examples" / "demo-kernels"
CASE_MANIFESTS = Path(settings.BASE_DIR) / "examples" / "cases"


def member(user: User, target: Target, role: str) -> User:
    """The user holds `role` on the target (and in the global groups, as the admin has it)."""
    user.groups.add(Group.objects.get_or_create(name=role)[0])
    TargetMembership.objects.update_or_create(target=target, user=user, defaults={"role": role})
    return user


def members_of_new_target(target: Target) -> Target:
    """Every user who holds a role joins the target in their first role (the test world's
    one team; see UserFactory.member_of)."""
    target_add_role_holders(target=target)
    return target


@pytest.fixture(scope="session", autouse=True)
def own_static_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The suite's static files are never the installation's collected ones. `standalone` (and
    `manage.py prepare`) collects into the data folder of the checkout (.infraops/staticfiles),
    with a manifest of hashed names; read by the test process, that manifest would have pages
    name files the in-process test server (which serves from the finders) does not have, and
    the browser tests would see pages without their styles and scripts. An empty root of the
    session's own: every file keeps its plain name, served from static/."""
    from django.test.utils import override_settings

    root = tmp_path_factory.mktemp("staticfiles")
    with override_settings(STATIC_ROOT=root):  # its signal drops the storage's cached manifest
        yield root


@pytest.fixture(scope="session")
def local_repositories_from_tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tests seed their origins in tmp_path: pytest's base temporary folder is where the
    tests' installation takes local repositories from (INFRAOPS_REPO_LOCAL_ROOTS, the
    sanctioned way; users' URLs stay under the policy of infraops/repourls.py)."""
    return tmp_path_factory.getbasetemp().resolve()


@pytest.fixture(autouse=True)
def data_dir(settings: Any, local_repositories_from_tmp: Path) -> Iterator[Path]:
    """Each test gets its own data folder (clones, worktrees, probe outputs, the blob store's
    files). Not under pytest's tmp_path: that is private to root, and the sandbox user must
    reach worktrees."""
    path = Path(tempfile.mkdtemp(prefix="infraops-test-"))
    path.chmod(0o755)
    settings.DATA_DIR = path
    settings.REPO_LOCAL_ROOTS = (str(local_repositories_from_tmp),)
    settings.STORAGES = {**settings.STORAGES, "blobs": {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        "OPTIONS": {"location": str(path / "blobs")}}}
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(autouse=True)
def leases_inside_the_test_transaction(request: pytest.FixtureRequest,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """An experiment run in this process by a plain database test lives in the test's open
    transaction, which the lease's heartbeat thread (its own connection) cannot see: a probe
    slower than one beat (a loaded machine) would read as a lost lease. Such tests renew only
    from their own thread's writes; transactional tests and real workers keep the heartbeat."""
    marker = request.node.get_closest_marker("django_db")
    transactional = bool({"transactional_db", "live_server"} & set(request.fixturenames)) or (
        marker is not None and bool(marker.kwargs.get("transaction", marker.args[:1] == (True,))))
    if not transactional:
        from infraops.experiments import services as experiments

        monkeypatch.setattr(experiments, "RENEW_EVERY", 24 * 3600.0)


@pytest.fixture
def fast_password_hashing(settings: Any) -> None:
    """MD5 for the passwords of the users a test makes: the default hasher costs 0.2-0.6 s
    each, and most tests make two or three users. The real hashers stay listed after it, so a
    password hashed before the switch still checks."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher",
                                 *settings.PASSWORD_HASHERS]


@pytest.fixture(autouse=True)
def fast_password_hashing_in_process(request: pytest.FixtureRequest) -> None:
    """Every test gets fast_password_hashing but those whose users sign in through web
    processes of their own, which read the real settings and cannot check an MD5 hash: the
    e2e and browser tests, and any test with a live server."""
    node = request.node
    if (node.get_closest_marker("e2e") is None and node.get_closest_marker("browser") is None
            and not {"live_server", "live_system"} & set(request.fixturenames)):
        request.getfixturevalue("fast_password_hashing")


@pytest.fixture
def engineer(db: None) -> User:
    return UserFactory.create(username="erin", roles=["engineer"])


@pytest.fixture
def reviewer(db: None) -> User:
    return UserFactory.create(username="rae", roles=["reviewer"])


@pytest.fixture
def viewer(db: None) -> User:
    return UserFactory.create(username="vic", roles=["viewer"])


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A folder outside the repository (or worktree) under test, with a secret in it: the
    canary that a read or write through `..`, a symlink or an absolute path must not reach."""
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "secret.txt").write_text("API_KEY=sk-outside\n")
    return folder


@pytest.fixture
def skeleton_seeds(db: None) -> None:
    """The skeletons migration 0002 seeds, made again: a transactional test before this one
    flushed every table, data migrations' rows included."""
    from django.apps import apps

    importlib.import_module("skeletons.migrations.0002_seed_skeletons").seed(apps, None)


def case_source(tmp_path: Path, case: str) -> Path:
    """The demo repository (examples/demo-kernels) under one case's manifest
    (examples/cases/<case>.toml): the three cases of docs/product.md, each on its own."""
    source = tmp_path / f"{case}-source"
    shutil.copytree(DEMO, source, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copyfile(CASE_MANIFESTS / f"{case}.toml", source / "infraops.toml")
    return source


def make_origin(tmp_path: Path, source: Path = EXAMPLE, name: str = "origin.git") -> Path:
    """A bare repository seeded from a folder, like load_example makes. The example's (which
    no test writes) is made once per test process and copied: 570 tests start from it, and
    its git commands cost 60-180 ms a test on a loaded machine, a copy a few."""
    origin = tmp_path / name
    if source == EXAMPLE:
        shutil.copytree(_example_origin(), origin)
    else:
        gitops.repo_init_from_dir(source, origin, branch="main", message="seed")
    return origin


@functools.cache
def _example_origin() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="infraops-example-origin-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    origin = folder / "origin.git"
    gitops.repo_init_from_dir(EXAMPLE, origin, branch="main", message="seed")
    return origin


@pytest.fixture
def example_source(tmp_path: Path) -> Path:
    """A writable copy of examples/tiny-serving to vary per test."""
    copy = tmp_path / "example-src"
    shutil.copytree(EXAMPLE, copy)
    return copy


@pytest.fixture
def example_target(db: None, tmp_path: Path) -> Target:
    return members_of_new_target(target_register(
        name="tiny-serving", repo_url=str(make_origin(tmp_path)), base_branch="main",
        push_on_merge=True))


@pytest.fixture
def example_goal(example_target: Target, engineer: User) -> Goal:
    return GoalFactory.create(
        target=example_target, name="latency", probe="latency-bench", metric="latency_ms",
        direction="minimize", relative_target=0.1, owner=engineer,
        boundary__editable_paths="config/**", boundary__max_experiments=8,
        criteria=[{"kind": "relative", "probe": "latency-bench", "metric": "latency_ms",
                   "comparison": "<=", "value": -0.05}],
        snapshot_by=engineer)


SLOW_TESTS = Path(__file__).with_name("slow_tests.txt")
SLOW_SECONDS = 1.0


LONGEST_PARAMETER_ID = 100


def pytest_make_parametrize_id(config: pytest.Config, val: object, argname: str) -> str | None:
    """A parameter of more than LONGEST_PARAMETER_ID characters (the fuzz's megabyte traces,
    100,000 nested brackets) is named by its length and a hash, not spelt out in its test's id:
    the id travels in PYTEST_CURRENT_TEST to every process the test starts, and one of 200 KB
    left none of them room to start (git: "Argument list too long"), besides crossing to the
    xdist controller with every report."""
    if isinstance(val, str | bytes) and len(val) > LONGEST_PARAMETER_ID:
        data = val.encode("utf-8", "surrogatepass") if isinstance(val, str) else val
        return f"{argname}-{len(val)}-long-{hashlib.sha256(data).hexdigest()[:10]}"
    return None


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--record-slow", metavar="PATH", default=None,
                     help=f"write the node ids of the tests that took {SLOW_SECONDS} s or more "
                          "(setup, call and teardown) to PATH, as tests/slow_tests.txt holds them")


def slow_ids(path: Path = SLOW_TESTS) -> set[str]:
    return {line.strip() for line in path.read_text().splitlines()
            if line.strip() and not line.startswith("#")}


_durations: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _durations[report.nodeid] = _durations.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    target = session.config.getoption("--record-slow")
    if target and not hasattr(session.config, "workerinput"):  # the xdist controller, or alone
        header = [line for line in SLOW_TESTS.read_text().splitlines() if line.startswith("#")]
        slow = sorted({without_group(node) for node, seconds in _durations.items()
                       if seconds >= SLOW_SECONDS})
        Path(target).write_text("\n".join(header + slow) + "\n")


def without_group(nodeid: str) -> str:
    """The node id as collected: under --dist loadgroup xdist reports a grouped test's id with
    `@<group>` after it (an `@` inside a parameter's brackets is the parameter's)."""
    return nodeid[:nodeid.rfind("@")] if nodeid.rfind("@") > nodeid.rfind("]") else nodeid


_slow: set[str] | None = None


def pytest_itemcollected(item: pytest.Item) -> None:
    """The tests of tests/slow_tests.txt are marked slow as they are collected, before `-m`
    selects by markers."""
    global _slow
    if _slow is None:
        _slow = slow_ids()
    if item.nodeid in _slow:
        item.add_marker(pytest.mark.slow)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Browser tests run last. Playwright's sync API keeps an event loop running in the test
    thread for the rest of the session once a browser starts, and every later async_to_sync
    in that thread (the websocket tests, live notifications) would then refuse to run. Runs
    after pytest-django's own ordering, keeping it within each part."""
    browser = [item for item in items if item.get_closest_marker("browser")]
    # Under pytest-xdist (--dist loadgroup) the same rule holds per worker process: the queue
    # is handed out in this order (groups of several tests first, the largest first), so a
    # worker that has taken a browser test is given only browser tests after it, and both
    # workers share them. (A group marker added here would come too late: xdist names groups
    # in its own hook, which runs before this one.)
    # Within each of pytest-django's parts, the slow tests (tests/slow_tests.txt) first: the
    # longest-first rule of scheduling, so that two workers end together instead of one of them
    # taking a minute-long test when nothing else is left.
    rest = [item for item in items if not item.get_closest_marker("browser")]
    rest.sort(key=lambda item: (_django_part(item), not item.get_closest_marker("slow")))
    # The longest browser tests first (the faults tests, 20-60 s each), for the same reason.
    browser.sort(key=lambda item: item.path.name not in LONGEST_BROWSER_MODULES)
    items[:] = rest + browser


LONGEST_BROWSER_MODULES = ("test_faults.py", "test_showcase.py", "test_thin_loop.py")


def _django_part(item: pytest.Item) -> int:
    """pytest-django's order of a test (pytest_django.plugin.pytest_collection_modifyitems):
    0 database, 1 transactional database, 2 none. Kept, as Django keeps it: a transactional
    test empties the tables that plain database tests may read."""
    from django.test import TestCase, TransactionTestCase
    from pytest_django.plugin import validate_django_db

    test_class = getattr(item, "cls", None)
    if test_class and issubclass(test_class, TransactionTestCase):
        return 0 if issubclass(test_class, TestCase) else 1
    marker = item.get_closest_marker("django_db")
    transactional = False
    if marker:
        transaction, reset_sequences, *_ = validate_django_db(marker)
        transactional = bool(transaction or reset_sequences)
    fixtures = getattr(item, "fixturenames", ())
    if transactional or "transactional_db" in fixtures or "live_server" in fixtures:
        return 1
    return 0 if marker or "db" in fixtures else 2


@pytest.fixture
def close_thread_connections() -> Iterator[None]:
    """Websocket consumers run their database calls on other threads, each with its own
    connection, which would outlive the test and block dropping the test database: close
    them when the test ends."""
    made: list[Any] = []

    def record(sender: Any, connection: Any, **kwargs: Any) -> None:
        made.append(connection)

    connection_created.connect(record, dispatch_uid="tests-close-thread-connections")
    yield
    connection_created.disconnect(dispatch_uid="tests-close-thread-connections")
    for wrapper in made:
        if wrapper is not connections["default"] and wrapper.connection is not None:
            wrapper.connection.close()
