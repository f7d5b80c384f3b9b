"""What both policies share: the manifest the run pinned, its boundary, its worktree, and the
two acts that leave a policy's hands, requesting an experiment and submitting a change.

Each act does its whole bookkeeping here (the run's counters, its experiments and changes, the
hypothesis it serves, the event on the run page), so a policy or a tool cannot do half of it.
"""

from __future__ import annotations

import random
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction

from agents.events import run_event
from agents.models import AgentRun, Hypothesis
from agents.policies.outcome import Finish
from infraops import gitops
from infraops.errors import DomainError
from infraops.experiments.services import experiment_request, margin_metric_of, margin_of
from infraops.manifest import Manifest
from infraops.models import Experiment
from infraops.services.targets import target_manifest_at
from reviews.diff_policy import Policy, Violation, check_diff
from reviews.models import Change
from reviews.services import change_submit

AGENT_AUTHOR = ("InfraOps agent", "agent@infraops.localhost")


# --- the manifest and the boundary -------------------------------------------------------------

def pinned_manifest(run: AgentRun) -> Manifest:
    """The manifest at the run's base commit: the one the run pinned, whatever the target's
    branch holds now (its stored copy when that is still the same commit)."""
    return target_manifest_at(target=run.target, commit=run.base_commit)


def boundary(run: AgentRun) -> Policy:
    """The run's boundary as code: the pinned goal version's paths and caps, plus the pinned
    manifest's protected paths (the manifest itself and every probe's files)."""
    spec = run.goal_version.spec["boundary"]
    return Policy(editable=spec["editable_paths"],
                  protected=[*spec["protected_paths"], *pinned_manifest(run).protected_paths()],
                  forbidden_patterns=spec["forbidden_patterns"],
                  max_diff_lines=spec["max_diff_lines"])


def boundary_violations(run: AgentRun, commit: str) -> list[Violation]:
    """What the diff from the base to `commit` breaks of the run's boundary."""
    repo = run.target.clone_path
    return check_diff(gitops.diff(repo, run.base_commit, commit), boundary(run),
                      existing=gitops.list_files(repo, run.base_commit))


# --- the worktree ------------------------------------------------------------------------------

def run_worktree(run: AgentRun) -> Path:
    return Path(settings.DATA_DIR) / "runs" / f"run-{run.pk}"


def ensure_worktree(run: AgentRun) -> Path:
    """The run's worktree on its branch, made from the base commit the first time."""
    path = run_worktree(run)
    if not path.exists():
        run.branch = run.branch or f"infraops/run-{run.pk}"
        repo = run.target.clone_path
        branch = None if gitops.branch_exists(repo, run.branch) else run.branch
        gitops.worktree_add(repo, path, run.base_commit, branch=branch)
        if branch is None:  # the branch exists from an earlier worktree: continue on it
            gitops.git(path, "checkout", "--quiet", run.branch)
    return path


def fresh_worktree(run: AgentRun) -> Path:
    """The run's worktree reset to the base commit, detached (the tuner's trials start clean)."""
    path = run_worktree(run)
    repo = run.target.clone_path
    if path.exists():
        gitops.worktree_remove(repo, path)
    gitops.worktree_add(repo, path, run.base_commit)
    return path


def remove_worktree(run: AgentRun) -> None:
    worktree = run_worktree(run)
    if worktree.exists():
        try:
            gitops.worktree_remove(run.target.clone_path, worktree)
        except gitops.GitError:
            shutil.rmtree(worktree, ignore_errors=True)


def commit_worktree(worktree: Path, message: str) -> str:
    """Commit whatever the worktree holds; the commit it is now on."""
    commit = gitops.commit_all(worktree, message[:200], author_name=AGENT_AUTHOR[0],
                               author_email=AGENT_AUTHOR[1])
    return commit or gitops.rev_parse(worktree, "HEAD")


# --- the two acts ------------------------------------------------------------------------------

def experiment_budget_left(run: AgentRun) -> int:
    return int(run.goal_version.spec["boundary"]["max_experiments"]) - run.experiment_count


def run_seed(run: AgentRun) -> int:
    """The run's INFRAOPS_SEED, drawn at its first experiment and kept in its state (saved with
    the step that queues the experiment)."""
    if run.state.get("seed") is None:
        run.state["seed"] = random.SystemRandom().randrange(2**31)
    return int(run.state["seed"])


def request_experiment(run: AgentRun, *, commit: str, probes: Sequence[str], origin: str,
                       variants: dict[str, list[str]] | None = None, describe: str = ""
                       ) -> Experiment:
    """Queue `commit` against the run's base under the goal's criteria and margin; count it,
    link it to the hypothesis being worked on, say so on the run page. DomainError when the
    budget is spent, the diff breaks the boundary or no probe applies (nothing is queued).

    Every experiment of the run draws its inputs from one seed (`run_seed`): two
    configurations are compared on the same inputs, so the inputs' noise cancels in the
    comparison instead of deciding it (common random numbers)."""
    budget = run.goal_version.spec["boundary"]["max_experiments"]
    if experiment_budget_left(run) <= 0:
        raise Refusal([f"experiment budget spent ({budget})"])
    violations = boundary_violations(run, commit)
    if violations:
        raise Refusal([str(v) for v in violations])
    spec = run.goal_version.spec
    extra: dict[str, Any] = {"variants": variants} if variants else {}
    experiment = experiment_request(
        target=run.target, candidate_commit=commit, baseline_commit=run.base_commit,
        probes=probes, origin=origin, criteria=spec["criteria"], margin=margin_of(spec),
        margin_metric=margin_metric_of(spec), seed=run_seed(run), **extra)
    run.experiments.add(experiment)
    run.experiment_count += 1
    hypothesis = run.state.get("hypothesis")
    if hypothesis:
        for entry in Hypothesis.objects.filter(run=run, pk=hypothesis):
            entry.experiments.add(experiment)
    run_event(run_id=run.pk, kind="experiment",
              message=f"Experiment {experiment.pk} queued on {commit[:10]}: "
                      + (describe or ", ".join(experiment.probes)) + ".",
              data={"experiment": experiment.pk})
    return experiment


class Refusal(DomainError):
    """The run's boundary or budget refuses the act; ``reasons`` say why."""

    def __init__(self, reasons: Sequence[str]) -> None:
        self.reasons = list(reasons)
        super().__init__("; ".join(self.reasons))


def out_of_budget(run: AgentRun, why: str) -> Finish:
    """A run a budget stopped, in words: the change it submitted last (its best so far), or
    that it submitted nothing."""
    change = run.changes.order_by("-pk").first()
    if change is None:
        return Finish(AgentRun.Status.FAILED, f"{why}; nothing submitted")
    return Finish(AgentRun.Status.SUCCEEDED, f"{why}; best so far submitted: change {change.pk}")


def agent_finished(run: AgentRun, summary: str) -> Finish:
    """The agent called finish: which change it submitted last, or that it submitted none."""
    change = run.changes.order_by("-pk").first()
    if change is None:
        return Finish(AgentRun.Status.FINISHED, f"nothing submitted: {summary}")
    return Finish(AgentRun.Status.SUCCEEDED, f"submitted change {change.pk}: {summary}")


def failing_check_findings(experiment: Experiment) -> list[dict[str, Any]]:
    """The experiment's failing correctness and integrity findings: what refuses it as a
    change's evidence, and what compare_experiments tells two experiments apart by."""
    return [f for f in experiment.feedback.get("findings", [])
            if f["layer"] in ("correctness", "integrity") and f["severity"] == "fail"]


def failing_checks(experiment: Experiment) -> list[str]:
    """Each failing correctness or integrity finding of the experiment, as 'title: detail'."""
    return [f"{f['title']}: {str(f.get('detail', ''))[:200]}"
            for f in failing_check_findings(experiment)]


def criteria_verdicts(experiment: Experiment) -> list[dict[str, Any]]:
    """Each criterion's verdict as measured (IntervalVerdict.as_dict: criterion, passed,
    quantity, interval, detail), not-run ones as not passed."""
    return [f["evidence"]["verdict"] for f in experiment.feedback.get("findings", [])
            if f["layer"] == "criteria"]


def submit_change(run: AgentRun, *, title: str, hypothesis: str, experiment: Experiment,
                  head_commit: str, evidence: dict[str, Any] | None = None) -> Change:
    """Submit base..head_commit for review with `experiment` as its evidence; the merge gate
    decides its status. The change joins the run and the run page says so."""
    with transaction.atomic():  # the change joins the run before anything hears of it
        change = change_submit(
            target=run.target, title=title, hypothesis=hypothesis,
            evidence={"experiment": experiment.pk, "criteria": criteria_verdicts(experiment),
                      "feedback": experiment.feedback.get("agent_text", ""),
                      **(evidence or {})},
            base_commit=run.base_commit, head_commit=head_commit,
            author_label=f"run {run.pk}", requested_by=run.started_by,
            goal_version=run.goal_version, experiment=experiment)
        run.changes.add(change)
    run_event(run_id=run.pk, kind="change",
              message=f"Change {change.pk} submitted ({change.get_status_display()}).",
              data={"change": change.pk})
    return change


def experiment_text(experiment: Experiment) -> str:
    """What the agent reads about a finished experiment: why it failed, if it did, then its
    feedback (which names a crashed probe's exit status, reason and stderr tail). Probe
    output is in it: callers wrap it with untrusted()."""
    text = str(experiment.feedback.get("agent_text", ""))
    reason = experiment.failure_reason
    if experiment.lost:  # not the candidate's doing: say so, or the model blames its edit
        reason = (f"lost to infrastructure, no evidence either way (run the experiment "
                  f"again): {reason}")
    if reason and reason not in text:
        text = f"Failure: {reason}\n{text}" if text else f"Failure: {reason}"
    return text
