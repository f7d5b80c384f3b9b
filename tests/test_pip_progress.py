"""scripts/setup.sh's progress line while pip installs (scripts/pip-progress.sh): only the
current step counts. The line read "installing, 2 of about 40 packages in place" while pip
was still resolving the second step, after the first step had installed pip itself."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from django.conf import settings

SCRIPT = Path(settings.BASE_DIR) / "scripts" / "pip-progress.sh"

FIRST_STEP = """== step 1 of 3: pip itself
Requirement already satisfied: pip in ./.venv/lib/python3.11/site-packages (23.0.1)
Collecting pip
  Using cached pip-24.3.1-py3-none-any.whl (1.8 MB)
Installing collected packages: pip
Successfully installed pip-24.3.1
"""
RESOLVING = """== step 2 of 3: the pinned packages
Collecting Django==5.1.4 (from -r requirements.txt (line 1))
  Using cached Django-5.1.4-py3-none-any.whl (8.2 MB)
Collecting celery[redis]==5.4.0 (from -r requirements.txt (line 2))
Collecting asgiref<4,>=3.8.1 (from Django==5.1.4)
Collecting django==5.1.4 (from -r requirements.txt (line 1))
"""


def progress(tmp_path: Path, log: str, *, installed: int = 0) -> str:
    """The line the script prints for this log, with `installed` packages put in place since
    the step's marker (and two from before it, which must not count)."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    for name in ("pip-24.3.1", "setuptools-65.5.0"):
        (site / f"{name}.dist-info").mkdir(exist_ok=True)
        os.utime(site / f"{name}.dist-info", (time.time() - 60, time.time() - 60))
    marker = tmp_path / "marker"
    marker.touch()
    os.utime(marker, (time.time() - 30, time.time() - 30))
    for n in range(installed):
        (site / f"package{n}-1.0.dist-info").mkdir()
    (tmp_path / "pip.log").write_text(log)
    done = subprocess.run([str(SCRIPT), str(tmp_path / "pip.log"), str(marker), str(site), "20"],
                          capture_output=True, text=True, check=True, timeout=30)
    return done.stdout.strip()


def test_while_pip_resolves_the_second_step_it_says_resolving_with_each_package_once(
        tmp_path: Path) -> None:
    assert progress(tmp_path, FIRST_STEP + RESOLVING) == (
        "... 20 s: step 2 of 3: the pinned packages: resolving, 3 packages found")


def test_while_pip_installs_it_counts_the_packages_of_this_step(tmp_path: Path) -> None:
    log = FIRST_STEP + RESOLVING + "Installing collected packages: asgiref, celery, django\n"
    assert progress(tmp_path, log, installed=2) == (
        "... 20 s: step 2 of 3: the pinned packages: installing, 2 of 3 packages in place")


def test_before_the_first_step_has_written_anything(tmp_path: Path) -> None:
    assert progress(tmp_path, "") == "... 20 s: starting: resolving, 0 packages found"
