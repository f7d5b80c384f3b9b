"""Run tools: the run's experiments, its hypothesis ledger, its change and its end.

They work on ``ctx.run`` (an AgentRun, under its row lock: the LLM policy calls them inside the
step's transaction) and tell the step what follows through ``ctx.effects``; the run's
lifecycle itself (waiting, finishing) is applied by agents/services.py.
"""

from __future__ import annotations

import json
from typing import Any

from agents.events import run_event
from agents.models import AgentRun, Hypothesis
from agents.policies.shared import (
    Refusal,
    commit_worktree,
    experiment_text,
    failing_checks,
    request_experiment,
    submit_change,
)
from agents.tools.base import ToolContext, ToolError, ToolResult, tool
from agents.tools.schema import MAX_ID, integer, obj, string
from infraops import gitops
from infraops.models import Experiment


def the_run(ctx: ToolContext) -> AgentRun:
    assert ctx.run is not None  # tool_call refuses run tools without a run
    return ctx.run


def run_experiment_of(ctx: ToolContext, pk: int) -> Experiment:
    """The run's experiment `pk`; ToolError naming the run's experiments otherwise."""
    run = the_run(ctx)
    experiment = run.experiments.filter(pk=pk).first()
    if experiment is None:
        ids = list(run.experiments.order_by("pk").values_list("pk", flat=True)[:50])
        raise ToolError(f"no experiment {pk} in this run",
                        f"This run's experiments: {', '.join(map(str, ids)) or 'none yet'}.")
    return experiment


_VARIANTS = {
    "type": "object",
    "description": "Only these variant cells of a probe, e.g. {\"bench\": [\"batch=8\"]} "
                   "(cells as 'key=value' joined by ','; list_probes shows them). Omit for "
                   "every cell.",
    "additionalProperties": {"type": "array", "maxItems": 100,
                             "items": string("A variant cell.", 500, minLength=1)},
}


@tool(
    "run_experiment",
    "Commit your edits; run probes (default: those covering them) vs the base. "
    "variants: {probe: [cells]}.",
    obj({
        "probes": {"type": "array", "description": "Probe names from infraops.toml.",
                   "items": string("A probe name.", 200, minLength=1), "maxItems": 50},
        "variants": _VARIANTS,
        "reason": string("What this experiment should tell you.", 2_000, minLength=1),
    }, required=["reason"]),
    needs_run=True,
)
def _run_experiment(ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
    run = the_run(ctx)
    head = commit_worktree(ctx.worktree, args["reason"])
    try:
        experiment = request_experiment(
            run, commit=head, probes=args.get("probes") or (), variants=args.get("variants"),
            origin=f"run {run.pk}, step {run.step_count + 1}")
    except Refusal as exc:
        reasons = "; ".join(exc.reasons)
        return ToolResult(False, json.dumps({"error": reasons, "tool": "run_experiment",
                                             "hint": "Work inside the boundary and the budget."}),
                          {"error": reasons}, refusal=reasons)
    ctx.effects.wait_for = ctx.effects.experiment = experiment.pk
    return ToolResult(True, f"Experiment {experiment.pk} queued (probes: "
                      f"{', '.join(experiment.probes)}); its feedback arrives at your next step.",
                      {"experiment": experiment.pk, "commit": head})


@tool(
    "inspect_experiment",
    "An experiment's status and feedback.",
    obj({"experiment_id": integer("The experiment's id.", 1, MAX_ID)},
        required=["experiment_id"]),
    untrusted=True, needs_run=True,
)
def _inspect_experiment(ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
    experiment = run_experiment_of(ctx, args["experiment_id"])
    ctx.effects.experiment = experiment.pk
    text = experiment_text(experiment) or "no feedback yet"
    return ToolResult(True, f"Experiment {experiment.pk} is {experiment.status}.\n{text}",
                      {"experiment": experiment.pk})


@tool(
    "record_hypothesis",
    "Add a ledger entry, or update one (hypothesis_id).",
    obj({
        "title": string("One line.", 200, minLength=1),
        "rationale": string("Why you believe it, and how you will test it.", 4_000,
                            minLength=1),
        "status": {"type": "string", "enum": ["open", "confirmed", "refuted", "abandoned"],
                   "description": "Where the hypothesis stands."},
        "hypothesis_id": integer("The hypothesis to update; omit to record a new one.",
                                 1, MAX_ID),
    }, required=["title", "rationale", "status"]),
    needs_run=True,
)
def _record_hypothesis(ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
    run = the_run(ctx)
    if args.get("hypothesis_id"):
        updated = Hypothesis.objects.filter(run=run, pk=args["hypothesis_id"]).update(
            status=args["status"], rationale=args["rationale"])
        if not updated:
            raise ToolError(f"no hypothesis {args['hypothesis_id']} in this run",
                            "Omit hypothesis_id to record a new one.")
        pk = args["hypothesis_id"]
    else:
        pk = Hypothesis.objects.create(run=run, title=args["title"],
                                       rationale=args["rationale"], status=args["status"]).pk
    run_event(run_id=run.pk, kind="step", message=f"Hypothesis {pk}: {args['title']} "
              f"({args['status']})", data={"ledger": True})
    if args["status"] == "open" and not _on_hypothesis_branch(run):
        # The experiments that follow test it: the ledger lists them as its evidence.
        run.state["hypothesis"] = pk
        return ToolResult(True, f"Hypothesis {pk} recorded; your next experiments test it.",
                          {"hypothesis": pk})
    return ToolResult(True, f"Hypothesis {pk} recorded.", {"hypothesis": pk})


def _on_hypothesis_branch(run: AgentRun) -> bool:
    """Whether switch_hypothesis put the run on a hypothesis's own branch (whose
    experiments stay that hypothesis's)."""
    current = run.state.get("hypothesis")
    return bool(current) and run.branch.endswith(f"-h{current}")


@tool(
    "switch_hypothesis",
    "Work on a hypothesis's own branch.",
    obj({"hypothesis_id": integer("The ledger id from record_hypothesis.", 1, MAX_ID)},
        required=["hypothesis_id"]),
    needs_run=True,
)
def _switch_hypothesis(ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
    run = the_run(ctx)
    hypothesis = Hypothesis.objects.filter(run=run, pk=args["hypothesis_id"]).first()
    if hypothesis is None:
        raise ToolError(f"no hypothesis {args['hypothesis_id']} in this run",
                        "Record it first with record_hypothesis.")
    commit_worktree(ctx.worktree, f"work in progress before switching to hypothesis "
                    f"{hypothesis.pk}")
    # Not run-N/hM: a ref run-N (the run's own branch) cannot also be a folder of refs.
    branch = f"infraops/run-{run.pk}-h{hypothesis.pk}"
    if gitops.branch_exists(run.target.clone_path, branch):
        gitops.git(ctx.worktree, "checkout", "--quiet", branch)
    else:
        gitops.git(ctx.worktree, "checkout", "--quiet", "-b", branch, run.base_commit)
    run.branch = branch
    run.state["hypothesis"] = hypothesis.pk
    run_event(run_id=run.pk, kind="step", data={"ledger": True},
              message=f"Working on hypothesis {hypothesis.pk} ({hypothesis.title}) on {branch}.")
    return ToolResult(True, f"Now on {branch}, for hypothesis {hypothesis.pk}.",
                      {"branch": branch, "hypothesis": hypothesis.pk})


@tool(
    "submit_change",
    "Submit your diff for review; evidence: an experiment on exactly this diff.",
    obj({
        "title": string("One line.", 200, minLength=1),
        "hypothesis": string("What the change does and why it helps.", 4_000, minLength=1),
        "experiment_id": integer("The experiment run on exactly this diff.", 1, MAX_ID),
    }, required=["title", "hypothesis", "experiment_id"]),
    needs_run=True,
)
def _submit_change(ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
    run = the_run(ctx)
    experiment = run_experiment_of(ctx, args["experiment_id"])
    if experiment.status != Experiment.Status.SUCCEEDED:
        raise ToolError(f"experiment {experiment.pk} {experiment.status}; the evidence must be "
                        "a succeeded experiment", "Fix what failed and run a new experiment.")
    findings = failing_checks(experiment)
    if findings:
        # A change its own evidence finds wrong or cheating is never submitted; the model
        # reads which findings, fixes them and submits again with a new experiment.
        reasons = (f"experiment {experiment.pk} has failing correctness or integrity "
                   f"findings: {'; '.join(findings)[:1500]}")
        return ToolResult(False, json.dumps({
            "error": reasons, "tool": "submit_change",
            "hint": "Fix what they find, run a new experiment, and submit with it."}),
            {"error": reasons, "findings": findings}, refusal=reasons)
    head = commit_worktree(ctx.worktree, f"change: {args['title']}")
    if _tree(ctx, head) != _tree(ctx, experiment.candidate_commit):
        raise ToolError(f"your worktree differs from what experiment {experiment.pk} ran "
                        f"({experiment.candidate_commit[:10]}); the evidence must be of exactly "
                        "this diff", "Run an experiment on the worktree as it is (or revert "
                        "the later edits), then submit with that experiment.")
    change = submit_change(run, title=args["title"], hypothesis=args["hypothesis"],
                           experiment=experiment, head_commit=head)
    ctx.effects.submitted = change.pk
    ctx.effects.experiment = experiment.pk
    failing = "; ".join(f"{c['title']}: {c['detail']}" for c in change.failing_checks)
    review = "; ".join(f"{c['title']}: {c['detail']}" for c in change.review_checks)
    gate_text = ((f" Merge gate checks failing: {failing}" if failing else "")
                 + (f" A reviewer decides on: {review}" if review else "")
                 ) or " Every gate check passed."
    return ToolResult(True, f"Change {change.pk} is {change.get_status_display()}."
                      + gate_text[:2000], {"change": change.pk, "commit": head})


def _tree(ctx: ToolContext, commit: str) -> str:
    return gitops.git(ctx.worktree, "rev-parse", "--verify", "--quiet",
                      f"{commit}^{{tree}}").strip()


@tool(
    "finish",
    "End the run with a summary.",
    obj({"summary": string("The summary.", 4_000, minLength=1)}, required=["summary"]),
    needs_run=True,
)
def _finish(ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
    ctx.effects.finish = args["summary"][:500]
    return ToolResult(True, "Finished.", {})
