"""Any two revisions of a target compared without a Django shell: from the command line
(manage.py experiment) and from the target page."""

from __future__ import annotations

from io import StringIO
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client

from infraops import gitops
from infraops.models import AuditEntry, Experiment, Target
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


# --------------------------------------------------------------------------- the target page


def signed_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_an_engineer_compares_two_revisions_from_the_target_page(
        engineer: User, example_target: Target, tmp_path: Path) -> None:
    candidate = commit_edit(example_target, tmp_path, "config/serving.toml",
                            "batch_size = 2", "batch_size = 8")
    client = signed_in(engineer)
    page = client.get("/targets/tiny-serving/").content.decode()
    assert 'action="/targets/tiny-serving/compare/"' in page
    assert 'value="latency-bench"' in page  # each probe of the manifest, to tick

    response = client.post("/targets/tiny-serving/compare/",
                           {"candidate": candidate, "probes": ["latency-bench"]})

    [made] = Experiment.objects.all()
    assert response.status_code == 302 and response["Location"] == f"/experiments/{made.pk}/"
    assert (made.candidate_commit, made.baseline_commit) == (candidate,
                                                             example_target.manifest_commit)
    assert (made.status, made.probes) == (Experiment.Status.QUEUED, ["latency-bench"])
    assert made.origin == f"compare {candidate} against main"
    [audit] = AuditEntry.objects.filter(action="experiment.compare")
    assert (audit.actor, audit.object_id, audit.data) == (
        engineer, str(made.pk), {"candidate": candidate, "base": "main"})


@pytest.mark.parametrize(("form", "message"), [
    ({"candidate": "no-such-branch"}, "&#x27;no-such-branch&#x27; names no commit of "
                                      "tiny-serving as its clone was last fetched"),
    ({"candidate": "main"}, "main and main are the same commit"),
    ({"candidate": "main~0", "base": "main"}, "are the same commit"),
    ({"candidate": ""}, "candidate: This field is required."),
    ({"candidate": "main", "base": "-x"}, "&#x27;-x&#x27; names no commit"),
    ({"candidate": "main", "probes": ["nowhere"]}, "probes: Select a valid choice."),
], ids=["unknown-revision", "same-commit", "same-commit-spelled-twice", "blank", "option-like",
        "unknown-probe"])
def test_a_bad_comparison_from_the_page_says_why_and_queues_nothing(
        engineer: User, example_target: Target, form: dict[str, object], message: str) -> None:
    response = signed_in(engineer).post("/targets/tiny-serving/compare/", form, follow=True)

    assert response.redirect_chain == [("/targets/tiny-serving/", 302)]
    assert message in response.content.decode()
    assert not Experiment.objects.exists()


def test_only_an_engineer_of_the_target_compares_its_revisions(
        viewer: User, reviewer: User, example_target: Target) -> None:
    for user in (viewer, reviewer):
        client = signed_in(user)
        assert "/compare/" not in client.get("/targets/tiny-serving/").content.decode()
        assert client.post("/targets/tiny-serving/compare/",
                           {"candidate": "main~1"}).status_code == 403
    assert not Experiment.objects.exists()
