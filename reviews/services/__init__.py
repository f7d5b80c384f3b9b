"""Services of the reviews app: submit (the gate routes a change), decide (reviewers' decisions
and comments), merge (intent first, git outside transactions, finished from git's state)."""

from __future__ import annotations

from reviews.services.decide import (
    change_comment,
    change_merge_request,
    change_refusal,
    decision_denial,
    requested_changes_reap,
    review_decide,
)
from reviews.services.facts import change_facts
from reviews.services.merge import change_advance, changes_reap, merge_message
from reviews.services.submit import change_gate_read, change_gate_refresh, change_submit

__all__ = [
    "change_advance",
    "change_comment",
    "change_facts",
    "change_gate_read",
    "change_gate_refresh",
    "change_merge_request",
    "change_refusal",
    "change_submit",
    "changes_reap",
    "decision_denial",
    "merge_message",
    "requested_changes_reap",
    "review_decide",
]
