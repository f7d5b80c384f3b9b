"""Fixtures shared by the sandbox's tests (test_sandbox.py, test_sandbox_limits.py,
test_accelerators.py)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from infraops.experiments.sandbox import SandboxIdentity, sandbox_identity, sandbox_prepare_dir

IS_ROOT = os.geteuid() == 0


@dataclass
class Dirs:
    base: Path
    work: Path
    out: Path
    identity: SandboxIdentity


def make_dirs(prefix: str = "infraops-sandbox-test-") -> Dirs:
    # pytest's tmp_path lives under a 0700 folder the sandbox uid could not reach.
    base = Path(tempfile.mkdtemp(prefix=prefix))
    base.chmod(0o755)
    identity = sandbox_identity() if IS_ROOT else SandboxIdentity(os.getuid(), os.getgid())
    work, out = base / "work", base / "out"
    sandbox_prepare_dir(work, identity)
    sandbox_prepare_dir(out, identity)
    return Dirs(base, work, out, identity)


@pytest.fixture
def dirs() -> Iterator[Dirs]:
    made = make_dirs()
    yield made
    shutil.rmtree(made.base, ignore_errors=True)
