"""Submitting a change: its diff, risk findings and merge gate; the gate routes it."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.db import transaction

from infraops import gitops
from infraops.errors import DomainError
from infraops.models import Experiment, GoalVersion, Target
from infraops.services.audit import audit_record
from reviews import diff_policy, gate, risk
from reviews.live import queue_changed
from reviews.models import Change
from reviews.services.facts import change_facts
from reviews.services.merge import change_merge_prepare
from reviews.signals import change_submitted_after_commit

MAX_TITLE = 300


def change_submit(
    *, target: Target, goal_version: GoalVersion | None, experiment: Experiment | None,
    title: str, hypothesis: str, evidence: dict[str, Any], base_commit: str, head_commit: str,
    author_label: str, requested_by: User | None,
) -> Change:
    """Record the diff base..head with its risk findings and merge gate.

    A change whose every gate check passes is prepared for merging at once (or re-verified
    first when only the base moved); every other change waits in the review queue. The branch
    itself moves after commit, in reviews.tasks.change_advance (git never moves inside this
    transaction)."""
    try:
        diff = gitops.diff(target.clone_path, base_commit, head_commit)
    except gitops.GitError as exc:
        raise DomainError(f"The change's diff cannot be computed: {exc}") from None
    if not diff.strip():
        raise DomainError("The change is empty: the candidate equals its base.")
    _check_policy(target, goal_version, diff, base_commit)
    findings = classify_diff(target, diff)
    findings += _binary_findings(diff, findings)
    with transaction.atomic():
        change = Change.objects.create(
            target=target, goal=goal_version.goal if goal_version else None,
            goal_version=goal_version, experiment=experiment, title=title[:MAX_TITLE],
            hypothesis=hypothesis, evidence=evidence, base_commit=base_commit,
            head_commit=head_commit, diff=diff, diff_sha256=Change.hash_diff(diff),
            risk=findings, risk_classes=sorted({f["category"] for f in findings}),
            author_label=author_label, requested_by=requested_by,
        )
        # First of this transaction's after-commit work: the library ties the run's skeletons
        # to the change before any merge task can decide it.
        change_submitted_after_commit(change.pk)
        checks = change_gate_refresh(change=change)
        audit_record(actor=None, actor_label=author_label, action="change.submit", obj=change,
                     data={"risk": change.risk_classes, "gate_passed": change.gate_passed,
                           "failing": [c.name for c in checks if not c.passed]})
        if change.gate_passed or gate.only_base_moved(checks):
            try:
                with transaction.atomic():
                    change_merge_prepare(
                        change=Change.objects.select_for_update().get(pk=change.pk))
            except gitops.GitError as exc:
                # It waits for a person instead, with the reason on the page.
                Change.objects.filter(pk=change.pk).update(
                    merge_error=f"the automatic merge could not be prepared: {exc}")
            else:
                _advance_after_commit(change.pk)
        queue_changed()
    change.refresh_from_db()
    return change


def _check_policy(target: Target, goal_version: GoalVersion | None, diff: str,
                  base_commit: str) -> None:
    """The boundary holds at submission too, whatever path the commit took to get here."""
    boundary: dict[str, Any] = goal_version.spec.get("boundary", {}) if goal_version else {}
    manifest = target.manifest()
    policy = diff_policy.Policy(
        editable=boundary.get("editable_paths") or ["**"],
        protected=[*boundary.get("protected_paths", []),
                   *(manifest.protected_paths() if manifest else ())],
        forbidden_patterns=boundary.get("forbidden_patterns", []),
        max_diff_lines=boundary.get("max_diff_lines", 1_000_000))
    try:
        existing = gitops.list_files(target.clone_path, base_commit)
    except gitops.GitError as exc:
        raise DomainError(f"The change's base cannot be read: {exc}") from None
    violations = diff_policy.check_diff(diff, policy, existing=existing)
    if violations:
        shown = "; ".join(str(v) for v in violations[:10])
        raise DomainError(f"The change breaks the goal's boundary: {shown}. Nothing was "
                          "submitted.")


def _binary_findings(diff: str, findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Binary files the policy saw that the classifier did not already call unclassified:
    no check reads their content, so a person must (fail closed)."""
    seen = {f["path"] for f in findings if f["category"] == risk.UNCLASSIFIED}
    return [{"category": risk.UNCLASSIFIED, "rule": "binary", "reason": v.reason,
             "path": v.path, "line": None, "text": ""}
            for v in diff_policy.review_reasons(diff) if v.path not in seen]


def classify_diff(target: Target, diff: str) -> list[dict[str, Any]]:
    """The risk findings of `diff` with the built-in rules and the target's own."""
    manifest = target.manifest()
    rules = risk.BUILTIN_RULES + (risk.rules_from_manifest(manifest.risk) if manifest else ())
    try:
        return [f.as_dict() for f in risk.classify(diff, rules)]
    except risk.DiffParseError as exc:
        raise DomainError(f"The change's diff cannot be read: {exc}") from None


def change_gate_refresh(*, change: Change) -> list[gate.Check]:
    """Evaluate the merge gate on the change's current facts and store the checks."""
    checks = gate.merge_gate(change_facts(change))
    passed = gate.gate_passed(checks)
    stored = [c.as_dict() for c in checks]
    # Written only when it moved: every read of an open change's page refreshes its gate.
    if (stored, passed) != (change.gate, change.gate_passed):
        Change.objects.filter(pk=change.pk).update(gate=stored, gate_passed=passed)
    change.gate, change.gate_passed = stored, passed
    return checks


# Changes whose gate may still decide something: their panel must say what is true now.
_OPEN = (Change.Status.PENDING_REVIEW, Change.Status.CHANGES_REQUESTED, Change.Status.APPROVED)


def change_gate_read(*, change: Change) -> Change:
    """The change with its gate as true now: an open change's checks are evaluated again when
    its page is read (main may have moved since the submit: issue 27 saw "Base unmoved"
    ticked under a "the base moved" banner). A merged or rejected change keeps the checks it
    was decided on; its page says so."""
    if change.status in _OPEN:
        change_gate_refresh(change=change)
    return change


def _advance_after_commit(change_id: int) -> None:
    from reviews.tasks import change_advance  # tasks import services, not the reverse

    transaction.on_commit(lambda: change_advance.delay(change_id))
