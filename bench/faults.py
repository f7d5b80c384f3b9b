"""Recovery from faults, through real processes: runs tests/e2e/test_faults.py (its own
redis-server, worker with beat, web; the local model stub) and prints what the tests measured:

  figure: redis_outage_recovery_s <v> s         Redis back -> the run's next step recorded
  figure: worker_kill_recovery_s <v> s          killed worker restarted -> the step taken again
  figure: pg_terminate_recovery_s <v> s         backends terminated -> the next step recorded
  figure: leftover_sandbox_processes_after_kills <n> count

Targets: worker_kill_recovery_s <= 120 (the reaper runs every 60 s from beat; a dead worker's
boot key expires within 15 s); leftovers 0. Needs DATABASE_URL (PostgreSQL; the test makes
its own test database) and Chromium, as the e2e tests do. Run from the repository root:

  DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres REDIS_URL=redis://127.0.0.1:6379/10 \\
    DJANGO_ALLOW_ASYNC_UNSAFE=true .venv/bin/python bench/faults.py [--smoke]

The tests make their test database as pytest-django does: `test_` and DATABASE_URL's name.
--smoke: only the fault that recovers soonest (terminated PostgreSQL backends: its figure,
pg_terminate_recovery_s), to show that the bench runs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


TESTS = "tests/e2e/test_faults.py"
SMOKE_TEST = "terminated_database_backends"  # a -k expression: the quickest of the three


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true",
                        help="only the terminated backends' test (its one figure)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        figures = Path(folder) / "figures.jsonl"
        env = os.environ | {"INFRAOPS_FAULT_FIGURES": str(figures)}
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", TESTS,
             *(["-k", SMOKE_TEST] if args.smoke else [])],
            cwd=ROOT, env=env, capture_output=True, text=True)
        if result.returncode != 0:
            sys.stderr.write(result.stdout[-6000:] + result.stderr[-3000:])
        lines = figures.read_text().splitlines() if figures.exists() else []
        for line in lines:
            item = json.loads(line)
            value = item["value"]
            shown = f"{value:.0f}" if item["unit"] == "count" else f"{value:.1f}"
            print(f"figure: {item['name']} {shown} {item['unit']}")
        return result.returncode


if __name__ == "__main__":
    raise SystemExit(main())
