"""The whole suite runs in pytest-xdist processes with `--dist loadgroup` (scripts/test.sh), and
some tests rely on their `xdist_group` mark: the standalone's lifecycle tests share one start
of the whole system (a module fixture, 30 s and more), the sandbox's bombs share one uid and
must never run at once. pytest 9.2 with pytest-xdist 3.8 ignored every such mark without a
word (xdist writes the group into a node id field that pytest 9.2 no longer reads): the
lifecycle was started twice a run and the bombs could meet. This runs the installed pair on a
small suite of its own and fails when a group is split."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = '''
import os, time
import pytest

GROUP = pytest.mark.xdist_group("together")


def record(name):
    with open(os.environ["GROUPS_LOG"], "a") as log:
        log.write(f"{name} {os.environ['PYTEST_XDIST_WORKER']}\\n")
    time.sleep(0.05)


@GROUP
@pytest.mark.parametrize("k", range(6))
def test_grouped(k):
    record(f"grouped{k}")


@pytest.mark.parametrize("k", range(12))
def test_free(k):
    record(f"free{k}")
'''


def test_tests_of_one_xdist_group_run_in_one_process(tmp_path: Path) -> None:
    (tmp_path / "test_groups.py").write_text(TESTS)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    log = tmp_path / "groups.log"
    # Only xdist among the installed plugins: the others (Django, Playwright, Hypothesis...)
    # cost each of the three processes seconds of imports on a loaded machine, for nothing.
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("DJANGO_", "PYTEST_"))} | {
               "GROUPS_LOG": str(log), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "xdist.plugin",
         "-c", str(tmp_path / "pytest.ini"), "--rootdir", str(tmp_path),
         "-n", "2", "--dist", "loadgroup", str(tmp_path / "test_groups.py")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    ran = dict(line.split() for line in log.read_text().splitlines())
    assert len(ran) == 18
    grouped = {worker for name, worker in ran.items() if name.startswith("grouped")}
    assert len(grouped) == 1, f"the group was split over {sorted(grouped)}: {ran}"
    # Both processes took part: the free tests were spread, so one process alone proves nothing.
    assert len(set(ran.values())) == 2, ran
