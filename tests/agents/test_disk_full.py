"""A full disk where the product writes worktrees pauses an agent run with the reason instead
of failing it; once space is freed, Resume takes the step again (issue 28, item 4)."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from agents import services
from agents.models import AgentRun
from infraops.models import Experiment, Goal
from tests.factories import ExperimentFactory

pytestmark = [pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning"),
              pytest.mark.django_db]


@pytest.fixture
def full_runs_folder(settings: Any) -> Iterator[Path]:
    """The data folder's runs/ (where run worktrees go) on a tiny file system, filled up."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small file system needs root")
    runs = Path(settings.DATA_DIR) / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k,nr_inodes=64", "tmpfs", str(runs)],
                   check=True)
    try:
        with (runs / "filler").open("wb") as filler, pytest.raises(OSError) as full:
            while True:
                filler.write(b"x" * 65536)
                filler.flush()
        assert full.value.errno == errno.ENOSPC
        yield runs
    finally:
        subprocess.run(["umount", "-l", str(runs)], check=False)


def test_a_full_disk_pauses_the_run_with_the_reason_and_resume_takes_the_step_again(
    example_goal: Goal, engineer: User, full_runs_folder: Path,
) -> None:
    run = services.run_start(goal=example_goal, user=engineer)

    # The tuner's first trial may be the current configuration, which writes nothing: steps
    # are taken until one writes the run's worktree.
    for number in range(10):
        services.run_step(run_id=run.pk, number=number)
        run.refresh_from_db()
        if run.status != AgentRun.Status.RUNNING:
            break

    assert run.status == AgentRun.Status.PAUSED, run.stop_reason
    assert run.stop_reason.startswith("the disk is full (")
    assert "No space left on device" in run.stop_reason
    assert "MB free in the data folder" in run.stop_reason
    assert "resume the run" in run.stop_reason
    paused_at = run.step_count

    (full_runs_folder / "filler").unlink()  # the engineer frees space
    services.run_resume(run=run, user=engineer)
    services.run_step(run_id=run.pk, number=paused_at)

    run.refresh_from_db()
    assert run.status == AgentRun.Status.RUNNING, run.stop_reason
    assert run.step_count == paused_at + 1  # the step the full disk stopped, taken again
    assert run.waiting_for is not None  # its experiment started: the worktree was written


def test_a_step_that_raised_a_full_disk_error_pauses_with_the_reason(
    example_goal: Goal, engineer: User,
) -> None:
    run = services.run_start(goal=example_goal, user=engineer)
    error = OSError(errno.ENOSPC, "No space left on device", "/data/runs/run-1/knobs.py")

    services.run_pause_for_error(run_id=run.pk, error=error)

    run.refresh_from_db()
    assert run.status == AgentRun.Status.PAUSED
    assert run.stop_reason.startswith(
        "the disk is full (No space left on device writing /data/runs/run-1/knobs.py)")


def test_other_errors_still_fail_or_pause_as_before(example_goal: Goal, engineer: User) -> None:
    run = services.run_start(goal=example_goal, user=engineer)

    services.run_pause_for_error(run_id=run.pk, error=OSError(errno.EACCES, "Permission denied"))

    run.refresh_from_db()
    assert run.stop_reason == "a step failed: PermissionError: [Errno 13] Permission denied"


@pytest.fixture
def steps_queued(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The runs whose next step was queued."""
    queued: list[int] = []
    monkeypatch.setattr(services, "_enqueue_step",
                        lambda run, countdown=None: queued.append(run.pk))
    return queued


def waiting_for_a_failed_experiment(run: AgentRun, reason: str,
                                    steps_queued: list[int]) -> Experiment:
    """The run now waits for an experiment that failed with reason (no step queued yet)."""
    failed = ExperimentFactory.create(
        target=run.target, candidate_commit="a" * 40, baseline_commit="b" * 40,
        status=Experiment.Status.FAILED, failure_reason=reason)
    AgentRun.objects.filter(pk=run.pk).update(waiting_for=failed)
    steps_queued.clear()  # step one, queued by the start
    return failed


def test_an_experiment_that_failed_on_a_full_disk_pauses_the_run_waiting_for_it(
    example_goal: Goal, engineer: User, steps_queued: list[int],
) -> None:
    run = services.run_start(goal=example_goal, user=engineer)
    full = waiting_for_a_failed_experiment(
        run, "unexpected error OSError: [Errno 28] No space left on device: "
             "'/data/experiments/7/out'", steps_queued)

    services.run_wake(experiment_id=full.pk)

    run.refresh_from_db()
    assert run.status == AgentRun.Status.PAUSED
    assert run.stop_reason.startswith(f"experiment {full.pk} failed on a full disk: ")
    assert "Free space on its worker, then resume the run." in run.stop_reason
    assert steps_queued == []  # no step is taken until it is resumed


def test_an_experiment_that_failed_otherwise_wakes_the_run_as_before(
    example_goal: Goal, engineer: User, steps_queued: list[int],
) -> None:
    run = services.run_start(goal=example_goal, user=engineer)
    failed = waiting_for_a_failed_experiment(run, "probe p failed: exited with status 1",
                                             steps_queued)

    services.run_wake(experiment_id=failed.pk)

    run.refresh_from_db()
    assert run.status == AgentRun.Status.RUNNING
    assert steps_queued == [run.pk]
