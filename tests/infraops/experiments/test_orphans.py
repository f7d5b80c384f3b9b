"""infraops/experiments/orphans.py: a worker's main process kills what its dead pool processes leave
behind, and nothing else.

The scenario runs in a child Python process, because a subreaper adopts every orphan of its
descendants: the test process itself must not become one. That process plays a prefork
worker's main process: a forked "pool process" starts a long `sleep` (no parent-death signal,
as git has none) and dies; a second fork of the main process (same command line, not listed
by the pool) and a listed child with another command line must both survive.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[3]

SCENARIO = r"""
import json, os, subprocess, sys, time
from infraops.experiments.orphans import OrphanReaper, become_subreaper

assert become_subreaper()
listed = subprocess.Popen(["sleep", "600"])  # stands for a pool process with its own title
twin = os.fork()  # stands for a pool process the pool has not listed yet, for ever
if twin == 0:
    time.sleep(600)
    os._exit(0)
left = os.pipe()
pool = os.fork()
if pool == 0:  # the pool process: starts what it runs, then is killed
    child = subprocess.Popen(["sleep", "600"], start_new_session=True)
    os.write(left[1], str(child.pid).encode())
    os._exit(0)
orphan = int(os.read(left[0], 32))
os.waitpid(pool, 0)  # the pool reaps its own process
reaper = OrphanReaper(lambda: {listed.pid}, interval=0.05)
reaper.start()
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    try:
        with open(f"/proc/{orphan}/stat") as stat:
            gone = stat.read().split(") ")[1][0] == "Z"
    except FileNotFoundError:
        gone = True
    if gone:
        break
    time.sleep(0.05)
time.sleep(0.5)  # more sweeps: the survivors must survive them too
survivors = [pid for pid in (listed.pid, twin) if os.path.exists(f"/proc/{pid}")]
print(json.dumps({"orphan": orphan, "orphan_gone": gone, "killed": reaper.killed,
                  "survivors": survivors, "expected": [listed.pid, twin]}))
for pid in (listed.pid, twin):
    os.kill(pid, 9)
    os.waitpid(pid, 0)
"""


def test_a_dead_pool_process_leaves_nothing_running_and_nothing_else_is_killed() -> None:
    result = subprocess.run([sys.executable, "-c", SCENARIO], cwd=ROOT, capture_output=True,
                            text=True, timeout=120, env={"PATH": "/usr/bin:/bin",
                                                         "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr
    outcome = json.loads(result.stdout.strip().splitlines()[-1])

    assert outcome["orphan_gone"], outcome
    assert [line.split()[0] for line in outcome["killed"]] == [str(outcome["orphan"])]
    assert "sleep 600" in outcome["killed"][0]
    assert outcome["survivors"] == outcome["expected"]
    with pytest.raises(psutil.NoSuchProcess):  # reaped, not a zombie under init
        psutil.Process(outcome["orphan"]).status()
