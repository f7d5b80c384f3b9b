"""manage.py experiment: any two revisions of a target compared from the command line."""

from __future__ import annotations

from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from infraops import gitops
from infraops.models import Experiment, Target
from tests.infraops.test_feedback_cases import commit_edit

pytestmark = pytest.mark.django_db(transaction=True)


def experiment(*args: str) -> str:
    out = StringIO()
    call_command("experiment", *args, stdout=out)
    return out.getvalue()


def test_it_runs_a_candidate_against_the_base_branch_here_and_prints_the_feedback(
        example_target: Target, tmp_path: Path) -> None:
    candidate = commit_edit(example_target, tmp_path, "config/serving.toml",
                            "batch_size = 2", "batch_size = 8")

    printed = experiment("tiny-serving", "--candidate", candidate, "--here")

    [made] = Experiment.objects.all()
    assert (made.candidate_commit, made.baseline_commit) == (candidate,
                                                             example_target.manifest_commit)
    assert made.status == Experiment.Status.SUCCEEDED
    assert made.origin == f"compare {candidate} against main"
    assert printed.startswith(f"Experiment {made.pk}: {candidate[:10]} against "
                              f"{made.baseline_commit[:10]}, probes latency-bench "
                              f"(/experiments/{made.pk}/)")
    assert "succeeded" in printed and "Verdict:" in printed


def test_without_here_it_is_queued_for_a_worker(example_target: Target, tmp_path: Path) -> None:
    candidate = commit_edit(example_target, tmp_path, "config/serving.toml",
                            "batch_size = 2", "batch_size = 8")

    printed = experiment("tiny-serving", "--candidate", candidate, "--base", "main")

    [made] = Experiment.objects.all()
    assert made.status == Experiment.Status.QUEUED
    assert printed.endswith("Queued on experiments; a worker runs it.\n")


@pytest.mark.parametrize(("args", "message"), [
    (("nowhere", "--candidate", "main"), "No target named 'nowhere'; targets: tiny-serving."),
    (("tiny-serving", "--candidate", "no-such-branch"),
     "'no-such-branch' names no commit of tiny-serving, here or upstream"),
    (("tiny-serving", "--candidate=-x"), "'-x' names no commit"),
    (("tiny-serving", "--candidate", "main"), "are the same commit"),
], ids=["unknown-target", "unknown-revision", "option-like", "same-commit"])
def test_a_bad_request_is_a_clear_error_and_queues_nothing(
        example_target: Target, args: tuple[str, ...], message: str) -> None:
    with pytest.raises(CommandError) as raised:
        experiment(*args)

    assert message in str(raised.value)
    assert not Experiment.objects.exists()


def test_a_branch_pushed_upstream_after_registration_is_fetched(
        example_target: Target, tmp_path: Path) -> None:
    origin = Path(example_target.repo_url)
    tree = tmp_path / "upstream-work"
    gitops.worktree_add(origin, tree, "main")
    config = tree / "config" / "serving.toml"
    config.write_text(config.read_text().replace("batch_size = 2", "batch_size = 4"))
    sha = gitops.commit_all(tree, "batch 4", author_name="t", author_email="t@t")
    assert sha is not None
    gitops.git(origin, "branch", "batch-4", sha)

    printed = experiment("tiny-serving", "--candidate", "batch-4")

    [made] = Experiment.objects.all()
    assert made.candidate_commit == sha and "Queued" in printed
