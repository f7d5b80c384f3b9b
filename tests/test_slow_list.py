"""tests/slow_tests.txt names tests that exist: a renamed or deleted test leaves no stale line
(the fast tier would then run a slow test again without anyone noticing)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import SLOW_TESTS, slow_ids

ROOT = Path(__file__).resolve().parents[1]


def test_every_slow_test_named_exists() -> None:
    missing = []
    for node in sorted(slow_ids()):
        file, _, name = node.partition("::")
        function = re.sub(r"\[.*\]$", "", name).rpartition("::")[2]
        path = ROOT / file
        if not path.is_file() or not re.search(rf"^\s*(?:async )?def {re.escape(function)}\(",
                                                path.read_text(), re.MULTILINE):
            missing.append(node)
    assert missing == [], f"{SLOW_TESTS.name} names tests that do not exist: {missing}"


def test_the_list_is_read_as_written(tmp_path: Path) -> None:
    listed = tmp_path / "slow.txt"
    listed.write_text("# a comment\ntests/a.py::test_x[1-2]\n\n  tests/b.py::test_y  \n")
    assert slow_ids(listed) == {"tests/a.py::test_x[1-2]", "tests/b.py::test_y"}
