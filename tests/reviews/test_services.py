"""reviews.services on the example target: submit, decide, merge, with real git and Postgres."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import cast

import pytest
from django.contrib.auth.models import User
from django.db import DatabaseError, connection, transaction
from django.test import Client

from infraops import gitops
from infraops.errors import DomainError
from infraops.models import AuditEntry, Target
from reviews.models import Change, ReviewDecision
from reviews.services import change_advance, change_submit, review_decide
from tests.conftest import UserFactory, member
from tests.reviews.conftest import SERVING_TOML, CommitOn, origin_moved


def main_tip(repo: Path) -> str:
    return gitops.rev_parse(repo, "refs/heads/main")


def origin_tip(target: Target) -> str:
    """Where main is in the target's own repository (the origin InfraOps cloned)."""
    return main_tip(Path(target.repo_url))


def test_a_config_change_awaits_review_as_production_risk(config_change: Change) -> None:
    assert config_change.status == Change.Status.PENDING_REVIEW
    assert config_change.risk_categories == ["production"]
    assert [(f["rule"], f["path"], f["line"], f["text"]) for f in config_change.risk] == [
        ("serving-config", "config/serving.toml", 2, "batch_size = 2"),
        ("serving-config", "config/serving.toml", 2, "batch_size = 8"),
    ]
    assert config_change.diff_sha256 == Change.hash_diff(config_change.diff)
    assert "+batch_size = 8" in config_change.diff
    assert config_change.merged_commit == ""


def test_submitting_an_empty_change_is_refused(example_target: Target) -> None:
    tip = main_tip(example_target.clone_path)

    with pytest.raises(DomainError, match="The change is empty"):
        change_submit(target=example_target, title="nothing", hypothesis="", evidence={},
                      base_commit=tip, head_commit=tip, author_label="run 1",
                      requested_by=None, goal_version=None, experiment=None)
    assert not Change.objects.exists()


def test_submitting_an_unknown_commit_is_refused(example_target: Target) -> None:
    tip = main_tip(example_target.clone_path)

    with pytest.raises(DomainError, match="cannot be computed"):
        change_submit(target=example_target, title="ghost", hypothesis="", evidence={},
                      base_commit=tip, head_commit="f" * 40, author_label="run 1",
                      requested_by=None, goal_version=None, experiment=None)
    assert not Change.objects.exists()


def test_an_engineer_without_the_reviewer_role_is_refused(config_change: Change,
                                                          engineer: User) -> None:
    with pytest.raises(DomainError, match="Only a reviewer can decide"):
        review_decide(change=config_change, reviewer=engineer, decision="approve")

    config_change.refresh_from_db()
    assert config_change.status == Change.Status.PENDING_REVIEW
    assert not ReviewDecision.objects.exists()


def test_the_person_who_started_the_run_is_refused_even_as_a_reviewer(
    example_target: Target, commit_on: CommitOn
) -> None:
    starter = member(cast(User, UserFactory(username="sam", roles=["engineer"])), example_target,
                     "reviewer")
    base, head = commit_on({"config/serving.toml": SERVING_TOML})
    change = change_submit(target=example_target, title="t", hypothesis="h", evidence={},
                           base_commit=base, head_commit=head, author_label="run 7",
                           requested_by=starter, goal_version=None,
                           experiment=None)

    with pytest.raises(DomainError, match="You started the run"):
        review_decide(change=change, reviewer=starter, decision="approve")

    change.refresh_from_db()
    assert change.status == Change.Status.PENDING_REVIEW
    assert not change.decisions.exists()
    assert main_tip(example_target.clone_path) == base


def test_an_unknown_decision_is_refused(config_change: Change, reviewer: User) -> None:
    with pytest.raises(DomainError, match="Unknown decision 'merge'"):
        review_decide(change=config_change, reviewer=reviewer, decision="merge")

    assert not ReviewDecision.objects.exists()


def test_a_reviewers_approval_merges_into_the_clone_and_pushes_to_the_origin(
    config_change: Change, reviewer: User, example_target: Target
) -> None:
    origin_before = origin_tip(example_target)

    decision = review_decide(change=config_change, reviewer=reviewer, decision="approve",
                             comment="Looks right.")

    config_change.refresh_from_db()
    assert config_change.status == Change.Status.MERGED
    assert config_change.merged_commit
    assert config_change.merged_at is not None
    message = gitops.git(example_target.clone_path, "show", "--no-patch", "--format=%B",
                         config_change.merged_commit)
    assert message.startswith(f"Merge change {config_change.pk}: Tune batch_size=8\n")
    assert "Bigger batches amortise." in message
    assert "Approved by rae." in message
    assert "{" not in message
    assert main_tip(example_target.clone_path) == config_change.merged_commit
    assert origin_tip(example_target) == config_change.merged_commit
    assert origin_before != config_change.merged_commit
    merged_config = gitops.read_file(Path(example_target.repo_url),
                                     config_change.merged_commit, "config/serving.toml")
    assert merged_config == SERVING_TOML.encode()
    assert (decision.decision, decision.comment) == ("approve", "Looks right.")
    assert decision.diff_sha256 == config_change.diff_sha256
    assert decision.base_commit == config_change.base_commit


def test_it_refuses_a_second_approval_and_records_nothing(config_change: Change,
                                                          reviewer: User) -> None:
    review_decide(change=config_change, reviewer=reviewer, decision="approve")
    other = cast(User, UserFactory(username="rob", roles=["reviewer"]))
    audit_before = AuditEntry.objects.count()
    tip_before = main_tip(config_change.target.clone_path)

    with pytest.raises(DomainError, match="already decided, so nothing was recorded"):
        review_decide(change=config_change, reviewer=other, decision="approve")

    assert config_change.decisions.count() == 1
    assert AuditEntry.objects.count() == audit_before
    assert main_tip(config_change.target.clone_path) == tip_before


@pytest.mark.parametrize(("decision", "status"), [
    ("reject", Change.Status.REJECTED),
    ("request_changes", Change.Status.CHANGES_REQUESTED),
])
def test_reject_and_request_changes_set_the_status_and_merge_nothing(
    config_change: Change, reviewer: User, decision: str, status: str
) -> None:
    base = config_change.base_commit

    made = review_decide(change=config_change, reviewer=reviewer, decision=decision,
                         comment="Batch 8 starves the KV transfer.")

    config_change.refresh_from_db()
    assert config_change.status == status
    assert config_change.merged_commit == ""
    assert made.comment == "Batch 8 starves the KV transfer."
    assert main_tip(config_change.target.clone_path) == base
    assert AuditEntry.objects.filter(action=f"change.{decision}",
                                     object_id=str(config_change.pk)).count() == 1


def test_an_approval_of_a_diff_that_no_longer_matches_refuses_to_merge(
    config_change: Change, reviewer: User
) -> None:
    Change.objects.filter(pk=config_change.pk).update(diff_sha256="0" * 64)
    base = config_change.base_commit

    with pytest.raises(DomainError, match="approval is void"):
        review_decide(change=config_change, reviewer=reviewer, decision="approve")

    config_change.refresh_from_db()
    assert config_change.status == Change.Status.PENDING_REVIEW
    assert config_change.merged_commit == ""
    assert main_tip(config_change.target.clone_path) == base
    assert not config_change.decisions.exists()


def test_when_the_base_branch_moved_an_approval_re_verifies_the_merged_tree_first(
    config_change: Change, reviewer: User, commit_on: CommitOn, example_target: Target
) -> None:
    repo = example_target.clone_path
    base, other = commit_on({"README.md": "Someone else's edit.\n"})
    moved = gitops.merge(repo, branch="main", commit=other, expected_base=base,
                         message="other work", author_name="Someone",
                         author_email="someone@example.test")
    origin_before = origin_tip(example_target)

    review_decide(change=config_change, reviewer=reviewer, decision="approve")

    config_change.refresh_from_db()
    assert config_change.status == Change.Status.REVERIFYING
    experiment = config_change.reverify_experiment
    assert experiment is not None
    assert experiment.baseline_commit == moved
    merged_tree = gitops.git(repo, "show", "--no-patch", "--format=%P", experiment.candidate_commit)
    assert merged_tree.split() == [moved, config_change.head_commit]
    assert config_change.merged_commit == ""
    assert main_tip(repo) == moved
    assert origin_tip(example_target) == origin_before
    assert AuditEntry.objects.filter(action="change.reverify").count() == 1


def test_a_change_that_passes_every_gate_check_merges_with_no_person(
    passing_submit: Callable[..., Change], example_target: Target
) -> None:
    change = passing_submit()
    assert change.risk == [], change.risk
    assert change.gate_passed, change.failing_checks
    assert change.status == Change.Status.MERGING  # intent recorded; git moves after commit
    assert main_tip(example_target.clone_path) == change.base_commit

    change = change_advance(change_id=change.pk)

    assert change.status == Change.Status.MERGED
    repo = example_target.clone_path
    assert main_tip(repo) == change.merged_commit == origin_tip(example_target)
    parents = gitops.git(repo, "show", "--no-patch", "--format=%P", change.merged_commit).split()
    assert parents == [change.base_commit, change.head_commit]
    merge_entry = AuditEntry.objects.get(action="change.merge")
    assert (merge_entry.actor, merge_entry.actor_label) == (None, "auto-merge")


def test_a_change_with_no_risky_line_but_no_evidence_waits_for_review(
    example_target: Target, commit_on: CommitOn
) -> None:
    base, head = commit_on({"README.md": "A small serving engine, documented.\n"})

    change = change_submit(target=example_target, title="Docs", hypothesis="h", evidence={},
                           base_commit=base, head_commit=head, author_label="run 2",
                           requested_by=None, goal_version=None, experiment=None)

    assert change.risk == []
    assert change.status == Change.Status.PENDING_REVIEW
    assert {"criteria-defined", "evidence"} <= {c["name"] for c in change.failing_checks}
    assert {"auto-merge"} <= {c["name"] for c in change.review_checks}
    assert main_tip(example_target.clone_path) == base


def test_submit_approve_and_merge_write_audit_entries(config_change: Change,
                                                      reviewer: User) -> None:
    review_decide(change=config_change, reviewer=reviewer, decision="approve")

    entries = AuditEntry.objects.filter(object_type="reviews.change",
                                        object_id=str(config_change.pk)).order_by("pk")
    assert [(e.action, e.actor_label) for e in entries] == [
        ("change.submit", "run 1"), ("change.approve", "rae"), ("change.merge", "rae"),
    ]
    submit, approve, merge = entries
    assert submit.data["risk"] == ["production"]
    assert submit.data["gate_passed"] is False
    assert "risk" in submit.data["failing"]
    assert approve.actor == reviewer
    assert approve.data["diff_sha256"] == config_change.diff_sha256
    assert merge.data == {"commit": config_change.merged_commit, "branch": "main",
                          "approved_by": reviewer.pk}


def test_control_characters_in_a_comment_are_stored_and_shown_escaped_in_the_audit_log(
    config_change: Change, reviewer: User, client: Client
) -> None:
    # A forged second line ("\n2026-01-01 admin approved") or a terminal escape must not pass
    # for an entry of its own in a log viewer or a psql session (reliability row D5).
    comment = "fine\n2026-01-01 change.approve by admin\x1b[2K\x1b[31mFAKE\r"
    review_decide(change=config_change, reviewer=reviewer, decision="reject", comment=comment)

    entry = AuditEntry.objects.get(action="change.reject")
    assert entry.data["comment"] == comment  # kept whole
    with connection.cursor() as cursor:
        cursor.execute("SELECT data::text FROM infraops_auditentry WHERE id = %s", [entry.pk])
        stored = cursor.fetchone()[0]
    assert not {"\n", "\r", "\x1b"} & set(stored)
    assert "\\n2026-01-01" in stored and "\\u001b[31m" in stored
    assert AuditEntry.objects.filter(object_type="reviews.change",
                                     object_id=str(config_change.pk)).count() == 2  # submit, reject
    admin = cast(User, UserFactory(username="root", roles=["engineer"]))
    admin.is_superuser = True
    admin.save()
    client.force_login(admin)
    page = client.get(f"/admin/infraops/auditentry/{entry.pk}/change/").content.decode()
    assert "FAKE" in page and "\x1b" not in page and "\r" not in page


@pytest.mark.parametrize("statement", ["update", "delete"])
def test_the_database_refuses_to_change_or_delete_audit_entries(config_change: Change,
                                                                statement: str) -> None:
    entry = AuditEntry.objects.get(action="change.submit")

    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        if statement == "update":
            AuditEntry.objects.filter(pk=entry.pk).update(action="change.nothing")
        else:
            AuditEntry.objects.filter(pk=entry.pk).delete()

    entry.refresh_from_db()
    assert entry.action == "change.submit"


def test_a_rejected_push_leaves_the_clones_branch_where_it_was(
    config_change: Change, reviewer: User, example_target: Target, tmp_path: Path
) -> None:
    with origin_moved(example_target, tmp_path):
        review_decide(change=config_change, reviewer=reviewer, decision="approve")

    config_change.refresh_from_db()
    assert config_change.status == Change.Status.MERGE_FAILED
    assert "rejected" in config_change.merge_error
    assert main_tip(example_target.clone_path) == config_change.base_commit


def test_a_change_outside_the_goals_boundary_is_refused_at_submission(
    passing_submit: Callable[..., Change]
) -> None:
    with pytest.raises(DomainError, match=r"breaks the goal's boundary: README.md: is outside "
                                          r"the editable paths"):
        passing_submit(files={"README.md": "Rewritten.\n"})

    assert not Change.objects.exists()


def test_a_binary_file_is_unclassified_and_keeps_the_change_waiting(
    passing_submit: Callable[..., Change]
) -> None:
    change = passing_submit(files={"serving/table.bin": "\x00\x01\x02 binary \x00"})

    assert "unclassified" in change.risk_classes
    assert change.status == Change.Status.PENDING_REVIEW
    # a reviewer decides: neutral, apart from failing evidence (issue 27)
    assert "analysed" in {c["name"] for c in change.review_checks}


def test_feedback_stored_before_cheats_went_uncredited_credits_a_cheat_no_gain() -> None:
    from infraops.models import Experiment
    from reviews.gate import NOT_CREDITED
    from reviews.services.facts import evidence_facts

    faster = {"layer": "performance", "kind": "perf-comparison", "severity": "pass",
              "title": "speed step_ms improved", "detail": "ratio 0.001",
              "evidence": {"probe": "speed", "metric": "step_ms",
                           "comparison": {"verdict": "improved"}}}
    cheat = {"layer": "integrity", "kind": "too-good-to-be-true", "severity": "fail",
             "title": "speed step_ms 1000x better: implausible", "detail": "d",
             "evidence": {"probe": "speed"}}

    honest = evidence_facts(Experiment(feedback={"findings": [faster]}))
    cheated = evidence_facts(Experiment(feedback={"findings": [faster, cheat]}))

    assert [r.verdict for r in honest.performance] == ["improved"]
    assert [r.verdict for r in cheated.performance] == [NOT_CREDITED]


def test_a_speed_up_beyond_the_bound_only_within_the_noise_flags_no_cheat() -> None:
    """A median beyond the plausibility bound whose interval reaches below it is a warning
    of the integrity layer (the showcase's 3.5x measured 5.6x on a loaded machine): the gate
    shows it with the findings and credits the gain; only a failing one is a cheat."""
    from infraops.models import Experiment
    from reviews.services.facts import evidence_facts

    faster = {"layer": "performance", "kind": "perf-comparison", "severity": "pass",
              "title": "bench ms improved", "detail": "ratio 0.18",
              "evidence": {"probe": "bench", "metric": "ms", "kind": "time",
                           "comparison": {"verdict": "improved"}}}
    noise = {"layer": "integrity", "kind": "beyond-the-bound-within-noise", "severity": "warn",
             "title": "bench ms 5.6x better: beyond the plausibility bound, within the noise",
             "detail": "the interval reaches down to 2.1x", "evidence": {"probe": "bench"}}

    facts = evidence_facts(Experiment(feedback={"findings": [faster, noise]}))

    assert facts.integrity == ()
    assert [(r.metric, r.verdict) for r in facts.performance] == [("ms", "improved")]
