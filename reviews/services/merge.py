"""Merging a change: the intent is recorded first, git moves outside any transaction, and the
record is completed afterwards. A restart, or a second attempt, finishes from git's state.

States (Change.Status):
    approved     --prepare-->  merging (merge commit written, intent stored)
                 --prepare-->  reverifying (the base moved: acceptance probes on the merged tree)
                 --prepare-->  conflict (git merge-tree found conflicting paths)
    reverifying  --passed-->   merging;  --failed--> pending_review (with the reason)
    merging      --complete--> merged (branch moved, pushed, audited once)
                 --refused-->  merge_failed (the origin refused the push: the clone is put back)

Every step takes the change's advisory lock (one process works on one change at a time; a
killed process's lock dies with its connection) and re-reads the row, so running any step
twice, or concurrently, has one effect.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from functools import partial
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from infraops import gitops
from infraops.dbretry import retried
from infraops.errors import DomainError
from infraops.experiments.services import (
    experiment_request,
    margin_metric_of,
    margin_of,
)
from infraops.models import Experiment
from infraops.services.audit import audit_record
from reviews import gate
from reviews.live import queue_changed
from reviews.models import Change
from reviews.services.facts import change_facts
from reviews.signals import change_decided_after_commit

log = logging.getLogger(__name__)

MERGE_AUTHOR = ("InfraOps", "infraops@localhost")
# pg_advisory_lock(key1, key2): key1 names this use, key2 the change.
_LOCK_SPACE = 0x1F0C
REVERIFY_CHECKS = ("criteria-defined", "evidence", "feedback", "integrity")
OPEN_MERGE_STATES = (Change.Status.APPROVED, Change.Status.MERGING, Change.Status.REVERIFYING)


@contextlib.contextmanager
def change_lock(change_id: int) -> Iterator[bool]:
    """Hold the change's session-level advisory lock; yields False when another process has it."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s, %s)", [_LOCK_SPACE, change_id])
        got = bool(cursor.fetchone()[0])
    try:
        yield got
    finally:
        if got:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s, %s)", [_LOCK_SPACE, change_id])


def change_advance(*, change_id: int) -> Change:
    """Take an approved (or automatically mergeable) change as far as it can go now.

    Call outside a transaction: git moves between the steps' own transactions. Safe to call
    twice and from several processes (the advisory lock; the guarded transitions)."""
    with change_lock(change_id) as got:
        if not got:
            return Change.objects.get(pk=change_id)
        change = Change.objects.get(pk=change_id)
        try:
            _advance(change)
        except gitops.GitError as exc:
            log.warning("change %s: git failed while merging", change_id, exc_info=True)
            change.refresh_from_db()
            if change.status == Change.Status.MERGING:
                # Where the branch is matters: keep the intent, the reaper tries again.
                Change.objects.filter(pk=change_id).update(merge_error=f"git failed, the "
                                                           f"merge is retried: {exc}")
            else:
                with transaction.atomic():
                    _fail(Change.objects.select_for_update().get(pk=change_id),
                          Change.Status.MERGE_FAILED, f"git failed: {exc}")
        change.refresh_from_db()
        return change


def _advance(change: Change) -> None:
    if change.status == Change.Status.APPROVED:
        with transaction.atomic():
            change_merge_prepare(change=Change.objects.select_for_update().get(pk=change.pk))
    elif change.status == Change.Status.REVERIFYING:
        with transaction.atomic():
            _reverify_check(Change.objects.select_for_update().get(pk=change.pk))
    change.refresh_from_db()
    if change.status == Change.Status.MERGING:
        _merge_complete(change)


def change_merge_prepare(*, change: Change) -> Change:
    """Decide how an approved or auto-mergeable change merges, and record it (no branch moves).

    Precondition: the caller holds the change's row lock in a transaction. Writes the merge
    commit object (git objects only) and sets merging + intent; or starts the re-verification
    when the base moved; or records the conflict."""
    target = change.target
    repo = target.clone_path
    current = gitops.diff(repo, change.base_commit, change.head_commit)
    if Change.hash_diff(current) != change.diff_sha256:
        return _fail(change, Change.Status.MERGE_FAILED,
                     "the diff changed since it was reviewed: the approval is void")
    tip = gitops.rev_parse(repo, f"refs/heads/{target.base_branch}")
    if tip == change.base_commit:
        return _intend(change, old=tip, commit=_write_merge_commit(change, tip))
    rv = change.reverify_experiment
    if rv is not None and rv.baseline_commit == tip and rv.is_finished:
        return _reverify_check(change)
    return _reverify_start(change, tip)


def _write_merge_commit(change: Change, tip: str) -> str:
    return gitops.merge_commit(change.target.clone_path, tip=tip, incoming=change.head_commit,
                               message=merge_message(change), author_name=MERGE_AUTHOR[0],
                               author_email=MERGE_AUTHOR[1])


def _intend(change: Change, *, old: str, commit: str) -> Change:
    gitops.keep_ref(change.target.clone_path, f"merges/change-{change.pk}", commit)
    intent = {"commit": commit, "old": old, "branch": change.target.base_branch,
              "actor": change.merge_intent.get("actor"),
              "actor_label": change.merge_intent.get("actor_label", "auto-merge"),
              "recorded_at": timezone.now().isoformat(),
              # what the merge went over, kept: the panel says it after the merge (issue 27)
              "over": [str(c["title"]) for c in change.gate if not c.get("passed")]}
    Change.objects.filter(pk=change.pk).update(status=Change.Status.MERGING, merge_intent=intent,
                                               merge_error="")
    change.refresh_from_db()
    queue_changed()
    return change


def _reverify_start(change: Change, tip: str) -> Change:
    try:
        merged = _write_merge_commit(change, tip)
    except gitops.MergeConflict as exc:
        return _fail(change, Change.Status.CONFLICT,
                     f"{change.target.base_branch} moved to {tip[:10]} and the change conflicts "
                     f"with it in {', '.join(exc.paths) or 'some files'}: the agent must rebase")
    gitops.keep_ref(change.target.clone_path, f"merges/change-{change.pk}", merged)
    criteria = change.goal_version.spec.get("criteria", []) if change.goal_version else []
    try:
        experiment = experiment_request(
            target=change.target, candidate_commit=merged, baseline_commit=tip,
            origin=f"re-verify change {change.pk} on {change.target.base_branch} at {tip[:10]}",
            criteria=criteria,
            margin=margin_of(change.goal_version.spec if change.goal_version else None),
            margin_metric=margin_metric_of(
                change.goal_version.spec if change.goal_version else None))
    except DomainError as exc:
        return _fail(change, Change.Status.MERGE_FAILED,
                     f"the base moved and the merged tree cannot be re-verified: {exc}")
    Change.objects.filter(pk=change.pk).update(status=Change.Status.REVERIFYING,
                                               reverify_experiment=experiment, merge_error="")
    audit_record(actor=None, actor_label="merge", action="change.reverify", obj=change,
                 data={"experiment": experiment.pk, "tip": tip, "merged": merged})
    change.refresh_from_db()
    queue_changed()
    return change


def reverify_checks(change: Change, experiment: Experiment) -> list[gate.Check]:
    """The gate's evidence checks, on the merged tree against the moved base."""
    facts = change_facts(change, head=experiment.candidate_commit,
                         base=experiment.baseline_commit, experiment=experiment)
    checks = gate.merge_gate(facts)
    return [c for c in checks if c.name in REVERIFY_CHECKS or c.name.startswith("criterion-")]


def _reverify_check(change: Change) -> Change:
    """Precondition: row lock held. Go on to merging once the re-verification passed (or a
    reviewer approved after seeing it fail); back to review when it failed."""
    rv = change.reverify_experiment
    if rv is None:
        return _fail(change, Change.Status.MERGE_FAILED, "re-verification was lost")
    rv.refresh_from_db()
    if not rv.is_finished:
        return change
    checks = reverify_checks(change, rv)
    tip = gitops.rev_parse(change.target.clone_path, f"refs/heads/{change.target.base_branch}")
    if tip != rv.baseline_commit:
        return _reverify_start(change, tip)
    passed = gate.gate_passed(checks)
    overridden = _approved_after(change, rv)
    if passed or overridden:
        return _intend(change, old=tip, commit=rv.candidate_commit)
    failing = "; ".join(f"{c.title}: {c.detail}" for c in checks if not c.passed)
    Change.objects.filter(pk=change.pk).update(
        status=Change.Status.PENDING_REVIEW,
        merge_error=f"re-verification on {change.target.base_branch} at {tip[:10]} "
                    f"(experiment {rv.pk}) failed: {failing}")
    audit_record(actor=None, actor_label="merge", action="change.reverify_failed", obj=change,
                 data={"experiment": rv.pk, "failing": [c.name for c in checks if not c.passed]})
    change.refresh_from_db()
    queue_changed()
    return change


def _approved_after(change: Change, experiment: Experiment) -> bool:
    """A reviewer approved this diff after the re-verification had finished: their call."""
    approval = change.valid_approval()
    return (approval is not None and experiment.finished_at is not None
            and approval.created_at > experiment.finished_at)


def _merge_complete(change: Change) -> None:
    """Move the branch to the intended merge commit, push it, and complete the record. Reads
    git's state first, so a repeat after a crash at any point finishes the same merge once."""
    intent: dict[str, Any] = change.merge_intent
    target = change.target
    repo = target.clone_path
    commit, old, branch = intent["commit"], intent["old"], intent["branch"]
    tip = gitops.rev_parse(repo, f"refs/heads/{branch}")
    if not gitops.is_ancestor(repo, commit, tip):
        try:
            gitops.branch_move(repo, branch, new=commit, old=old)
        except gitops.RefMoved:
            # The branch moved between the intent and now: verify again on the new tip.
            with transaction.atomic():
                locked = Change.objects.select_for_update().get(pk=change.pk)
                if locked.status == Change.Status.MERGING:
                    Change.objects.filter(pk=locked.pk).update(status=Change.Status.APPROVED)
                    locked.refresh_from_db()
                    change_merge_prepare(change=locked)
            return
    if target.push_on_merge:
        try:
            gitops.push(repo, "origin", branch)
        except gitops.GitError as exc:
            with contextlib.suppress(gitops.GitError):
                # Take the merge back, so the clone never holds what the origin refused.
                gitops.branch_move(repo, branch, new=old, old=commit)
            with transaction.atomic():
                _fail(Change.objects.select_for_update().get(pk=change.pk),
                      Change.Status.MERGE_FAILED, f"the origin refused the push: {exc}")
            return
    with transaction.atomic():
        done = Change.objects.filter(pk=change.pk, status=Change.Status.MERGING).update(
            status=Change.Status.MERGED, merged_commit=commit, merged_at=timezone.now(),
            merge_error="")
        if done:
            audit_record(actor=None, actor_label=intent.get("actor_label") or "auto-merge",
                         action="change.merge", obj=change,
                         data={"commit": commit, "branch": branch, "approved_by":
                               intent.get("actor")})
            queue_changed()
            change_decided_after_commit(change.pk, Change.Status.MERGED)


def _fail(change: Change, status: str, reason: str) -> Change:
    Change.objects.filter(pk=change.pk).update(status=status, merge_error=reason)
    audit_record(actor=None, actor_label="merge", action=f"change.{status}", obj=change,
                 data={"reason": reason})
    change.refresh_from_db()
    queue_changed()
    return change


def merge_message(change: Change) -> str:
    """The merge commit's message, written for a person reading the history."""
    intent = change.merge_intent
    who = (f"Approved by {intent['actor_label']}" if intent.get("actor")
           else "Merged automatically: every check of the merge gate passed")
    lines = [f"Merge change {change.pk}: {change.title}", "", "Hypothesis:",
             _indent(change.hypothesis or "(none given)"), ""]
    evidence = []
    if change.experiment is not None:
        evidence.append(f"experiment {change.experiment.pk} "
                        f"({change.experiment.candidate_commit[:10]} against "
                        f"{change.experiment.baseline_commit[:10]})")
    for check in change.gate:
        if check["name"].startswith("criterion-") or check["name"] == "end-to-end":
            mark = "passed" if check["passed"] else "FAILED"
            evidence.append(f"{check['title']}: {mark}, {check['detail']}")
    lines += ["Evidence:", *(_indent(e) for e in evidence or ["(none recorded)"]), ""]
    if change.risk_classes:
        lines += [f"Risk: {', '.join(change.risk_classes)}", ""]
    lines += [who + ".", "", f"InfraOps-Change: {change.pk}", f"Author: {change.author_label}",
              f"Diff-SHA256: {change.diff_sha256}"]
    return "\n".join(lines) + "\n"


def _indent(text: str) -> str:
    return "\n".join(f"  {line}" for line in text.strip().splitlines()[:20])


def changes_reap() -> list[int]:
    """Finish what a killed process left: approved, merging and re-verifying changes that no
    process is working on (their advisory lock is free). Beat runs it periodically. A
    dropped database connection costs a change a reconnect (infraops.dbretry), not its turn."""
    advanced = []
    for change_id in retried(lambda: list(Change.objects.filter(
            status__in=OPEN_MERGE_STATES).values_list("pk", flat=True)[:200]),
            what="open merges"):
        try:
            change = retried(partial(change_advance, change_id=change_id),
                             what=f"change {change_id} merge")
        except (gitops.GitError, DomainError):
            log.exception("change %s could not be advanced", change_id)
            continue
        if change.status not in OPEN_MERGE_STATES:
            advanced.append(change_id)
    return advanced
