"""bench/gpu_device.sh's `wait`: how a run longer than one lent command is followed, call after
call (its `run` needs the lent machine: docs/gpu.md)."""

from __future__ import annotations

import subprocess
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def wait(out: Path, seconds: int, pack: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "PACK": str(pack) if pack else ""}
    return subprocess.run(["bash", "bench/gpu_device.sh", "wait", str(out), str(seconds)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


def test_a_run_still_going_says_so_and_how_to_go_on_waiting(tmp_path: Path) -> None:
    out = tmp_path / "o"
    out.mkdir()
    (out / "started.log").write_text("experiment 2 of 5\n")

    done = wait(out, 0)

    assert done.returncode == 3
    assert "experiment 2 of 5" in done.stdout
    assert f"bench/gpu_device.sh wait {out} SECS" in done.stdout


def test_an_ended_run_gives_its_status_and_packs_its_folder(tmp_path: Path) -> None:
    out = tmp_path / "o"
    out.mkdir()
    (out / "summary.json").write_text("{}")
    (out / "rc").write_text("2\n")
    pack = tmp_path / "run.tgz"

    done = wait(out, 30, pack)

    assert done.returncode == 2
    assert "finished rc=2" in done.stdout
    with tarfile.open(pack) as archive:
        assert "o/summary.json" in archive.getnames()
