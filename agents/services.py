"""Agent runs: start, one step at a time, pause, resume, cancel.

One step per Celery task. A step reads the run under its row lock, acts once, records a
Step and events, and enqueues the next step after commit unless it now waits for an
experiment (the experiment_finished receiver wakes it) or the run ended.
"""

from __future__ import annotations

import shutil
import statistics
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AnonymousUser, User
from django.db import transaction
from django.utils import timezone

from agents.events import run_event
from agents.llm_step import (
    StepOutcome,
    llm_apply,
    llm_call,
    llm_prepare,
    no_progress,
    pinned_manifest,
    policy_for,
    run_worktree,
)
from agents.models import AgentRun, Hypothesis, RunMessage, Step
from agents.policies import tuner
from infraops import gitops
from infraops.analysis import MetricComparison
from infraops.errors import DomainError
from infraops.manifest import Knob, knob_apply, knob_read
from infraops.models import Experiment, Goal
from infraops.roles import ENGINEER, REVIEWER, has_role
from infraops.services.audit import audit_record
from infraops.services.experiments import experiment_request
from infraops.services.goals import goal_snapshot
from infraops.services.targets import target_refresh_manifest
from reviews.diff_policy import check_diff
from reviews.services import change_submit

AGENT_AUTHOR = ("InfraOps agent", "agent@infraops.localhost")


def _enqueue_step(run: AgentRun, countdown: float | None = None) -> None:
    from agents.tasks import agent_step

    number = run.step_count
    transaction.on_commit(
        lambda: agent_step.apply_async((run.pk, number), countdown=countdown or 0))


def _pause(run: AgentRun, reason: str) -> None:
    """Pause between steps with the reason on the run page; an engineer resumes it."""
    AgentRun.objects.filter(pk=run.pk, status=AgentRun.Status.RUNNING).update(
        status=AgentRun.Status.PAUSED, stop_reason=reason)
    run.status, run.stop_reason = AgentRun.Status.PAUSED, reason
    run_event(run_id=run.pk, kind="status", message=f"Run paused: {reason}",
              data={"status": "paused"})


def run_start(*, goal: Goal, user: User | AnonymousUser) -> AgentRun:
    """Pin the goal's current version, the manifest and the base commit; queue step one."""
    if not has_role(user, ENGINEER):
        raise DomainError("Only an engineer can start a run.")
    if goal.policy == Goal.Policy.LLM and not (
            settings.OPENAI_BASE_URL and (goal.model_name or settings.INFRAOPS_MODEL)):
        raise DomainError("The LLM policy needs OPENAI_BASE_URL and a model (INFRAOPS_MODEL, "
                          "or the goal's model): set them, or choose the built-in tuner.")
    target = target_refresh_manifest(target=goal.target)
    manifest = target.manifest()
    if manifest is None:
        raise DomainError(f"{target.name}'s infraops.toml is invalid: "
                          + "; ".join(target.manifest_errors))
    if goal.policy == Goal.Policy.TUNER and not manifest.knobs:
        raise DomainError(f"{target.name}'s manifest declares no [[knob]] for the tuner to turn.")
    with transaction.atomic():
        version = goal_snapshot(goal=goal, user=user)
        run = AgentRun.objects.create(
            goal_version=version, target=target, policy=goal.policy, started_by=user,
            base_commit=target.manifest_commit, manifest_sha256=target.manifest_sha256,
        )
        run_event(run_id=run.pk, kind="status",
                  message=f"Run started by {user.get_username()} on goal "
                          f"{goal.name!r} v{version.number}, base {run.base_commit[:10]}.")
        audit_record(actor=user, action="run.start", obj=run, data={"goal_version": version.pk})
        _enqueue_step(run)
    return run


def run_step(*, run_id: int, number: int) -> AgentRun | None:
    """Take step `number` of the run, unless it is not running or that step was taken.

    The tuner's step runs under the run's row lock. The LLM's step reads under the lock,
    calls the model with the lock released (Pause and Cancel never wait on a slow model), then
    locks again and keeps the reply only if the run is still at this step and running.
    """
    with transaction.atomic():
        run = _locked_for_step(run_id, number)
        if run is None or run.is_finished or run.status == AgentRun.Status.PAUSED:
            return run
        if run.policy != Goal.Policy.LLM:
            try:
                summary, tool, arguments, result = _tuner_step(run)
            except (DomainError, gitops.GitError) as exc:
                _finish(run, AgentRun.Status.FAILED, str(exc))
                return run
            _record_step(run, StepOutcome(summary, tool, arguments, result))
            return run
        prepared = llm_prepare(run)
    reply = llm_call(prepared)
    with transaction.atomic():
        run = _locked_for_step(run_id, number, checks=False)
        if run is None or run.status != AgentRun.Status.RUNNING:
            return run  # paused, cancelled or taken meanwhile: the reply is not kept
        try:
            outcome = llm_apply(run, prepared, reply)
        except (DomainError, gitops.GitError) as exc:
            _finish(run, AgentRun.Status.FAILED, str(exc))
            return run
        _record_step(run, outcome)
    return run


def _locked_for_step(run_id: int, number: int, *, checks: bool = True) -> AgentRun | None:
    """The run under its row lock when step `number` is due; with checks, a run out of budget
    ends and a stuck one pauses here (the returned run then says so)."""
    run = (AgentRun.objects.select_for_update().select_related("goal_version", "target")
           .filter(pk=run_id).first())
    if run is None or run.status != AgentRun.Status.RUNNING or run.step_count != number:
        return None
    if run.state.get("waiting_for") is not None:
        return None
    if not checks:
        return run
    stop = _budget_exhausted(run)
    if stop:
        _finish(run, AgentRun.Status.SUCCEEDED if run.changes.exists()
                else AgentRun.Status.FAILED, stop)
        return run
    stuck = no_progress(run) if run.policy == Goal.Policy.LLM else ""
    if stuck:
        _pause(run, stuck)
    return run


def _record_step(run: AgentRun, outcome: StepOutcome) -> None:
    """Keep one step's outcome: the Step row, its event, then end, pause, wait or go on."""
    if outcome.retry_after is not None:
        # The model asked us to wait: the step is taken again later, nothing counted.
        run.save(update_fields=["state"])
        _enqueue_step(run, countdown=outcome.retry_after)
        run_event(run_id=run.pk, kind="status", message=outcome.summary)
        return
    run.step_count += 1
    Step.objects.create(run=run, number=run.step_count, summary=outcome.summary,
                        tool=outcome.tool, arguments=outcome.arguments, result=outcome.result)
    ending = run.state.pop("finish", None)
    pause = run.state.pop("pause", None)
    run.save(update_fields=["step_count", "state", "experiment_count", "tokens_used",
                            "cost_usd", "malformed_in_row", "branch"])
    run_event(run_id=run.pk, kind="step", message=f"Step {run.step_count}: {outcome.summary}",
              data={"tool": outcome.tool} | (
                  {"change": outcome.result["change"]} if "change" in outcome.result else {}))
    if ending is not None:
        _finish(run, *ending)
    elif pause is not None:
        _pause(run, pause)
    elif run.state.get("waiting_for") is None:
        _enqueue_step(run)


def _budget_exhausted(run: AgentRun) -> str:
    budget = run.goal_version.spec["boundary"]
    if run.step_count >= budget["max_steps"]:
        return f"step budget spent ({budget['max_steps']} steps)"
    elapsed = (timezone.now() - run.created_at).total_seconds() / 60
    if elapsed >= budget["max_wall_minutes"]:
        return f"wall-time budget spent ({budget['max_wall_minutes']} minutes)"
    return ""


def _finish(run: AgentRun, status: str, reason: str) -> None:
    run.status = status
    run.stop_reason = reason
    run.finished_at = timezone.now()
    run.state.pop("waiting_for", None)
    run.save(update_fields=["status", "stop_reason", "finished_at", "state"])
    run_event(run_id=run.pk, kind="status", message=f"Run {status}: {reason}",
              data={"status": status})
    worktree = run_worktree(run)
    if worktree.exists():
        try:
            gitops.worktree_remove(run.target.clone_path, worktree)
        except gitops.GitError:
            shutil.rmtree(worktree, ignore_errors=True)


# --- the tuner policy's step -------------------------------------------------------------

def _tuner_step(run: AgentRun) -> tuple[str, str, dict[str, Any], dict[str, Any]]:
    """One tuner action: read the last experiment, or try the next configuration, or submit."""
    spec = run.goal_version.spec
    knobs = list(pinned_manifest(run).knobs)
    trials: list[dict[str, Any]] = run.state.setdefault("trials", [])
    pending = next((t for t in trials if t.get("objective") is None and not t.get("failed")), None)
    if pending is not None:
        return _tuner_read(run, pending, spec)
    budget = min(float(spec["boundary"]["max_experiments"]), tuner.space_size(knobs))
    if len(trials) < budget:
        return _tuner_try(run, knobs, trials, spec)
    return _tuner_submit(run, trials, spec)


def _tuner_try(run: AgentRun, knobs: list[Knob], trials: list[dict[str, Any]],
               spec: dict[str, Any]) -> tuple[str, str, dict[str, Any], dict[str, Any]]:
    repo = run.target.clone_path
    history = [tuner.Trial(t["params"], t.get("objective")) for t in trials]
    params = tuner.suggest(knobs, history, seed=run.pk)
    current = {k.name: knob_read(k, _base_text(run, k)) for k in knobs}
    trial: dict[str, Any] = {"number": len(trials) + 1, "params": params}
    trials.append(trial)
    if params == current:
        # The base configuration is the baseline itself: an A/A run would only measure noise.
        trial["objective"] = 1.0
        trial["commit"] = run.base_commit
        return (f"Configuration {params} is the current one: objective 1.0 by definition.",
                "tuner.ask", {"params": params}, {"objective": 1.0})
    commit = _commit_configuration(run, knobs, params)
    violations = check_diff(gitops.diff(repo, run.base_commit, commit), policy_for(run, spec),
                            existing=gitops.list_files(repo, run.base_commit))
    if violations:
        trial["failed"] = True
        run_event(run_id=run.pk, kind="refusal",
                  message="Edit refused: " + "; ".join(str(v) for v in violations))
        return (f"Refused configuration {params}: it breaks the boundary.", "edit",
                {"params": params}, {"violations": [str(v) for v in violations]})
    experiment = experiment_request(
        target=run.target, candidate_commit=commit, baseline_commit=run.base_commit,
        probes=[spec["probe"]], origin=f"run {run.pk}, trial {trial['number']}",
        criteria=spec["criteria"],
    )
    run.experiments.add(experiment)
    run.experiment_count += 1
    trial.update(commit=commit, experiment=experiment.pk)
    run.state["waiting_for"] = experiment.pk
    run_event(run_id=run.pk, kind="experiment",
              message=f"Experiment {experiment.pk} queued: {params} vs base.",
              data={"experiment": experiment.pk})
    return (f"Trying {params}: experiment {experiment.pk} on commit {commit[:10]}.",
            "run_experiment", {"params": params, "probes": [spec["probe"]]},
            {"experiment": experiment.pk, "commit": commit})


def _base_text(run: AgentRun, knob: Knob) -> str:
    raw = gitops.read_file(run.target.clone_path, run.base_commit, knob.file)
    if raw is None:
        raise DomainError(f"Knob {knob.name}'s file {knob.file} is missing at the base commit.")
    return raw.decode()


def _commit_configuration(run: AgentRun, knobs: list[Knob], params: dict[str, str]) -> str:
    """A commit on top of the base with the knobs set to params (each trial starts clean)."""
    path = run_worktree(run)
    repo = run.target.clone_path
    if path.exists():
        gitops.worktree_remove(repo, path)
    gitops.worktree_add(repo, path, run.base_commit)
    for knob in knobs:
        file = path / knob.file
        file.write_text(knob_apply(knob, file.read_text(), params[knob.name]))
    commit = gitops.commit_all(path, f"tuner: {params}", author_name=AGENT_AUTHOR[0],
                               author_email=AGENT_AUTHOR[1])
    if commit is None:
        raise DomainError(f"Setting {params} changed no file.")
    return commit


def _comparisons(experiment: Experiment) -> list[MetricComparison]:
    return [MetricComparison(**{k: v for k, v in c.items() if k != "ratio"})
            for c in experiment.summary.get("comparisons", [])]


def _goal_medians(
    experiment: Experiment, spec: dict[str, Any]
) -> tuple[float | None, float | None]:
    rows = [c for c in _comparisons(experiment)
            if c.probe == spec["probe"] and c.metric == spec["metric"]]
    cand = [c.candidate_median for c in rows if c.candidate_median is not None]
    base = [c.baseline_median for c in rows if c.baseline_median is not None]
    return (statistics.median(cand) if cand else None, statistics.median(base) if base else None)


def _tuner_read(run: AgentRun, trial: dict[str, Any], spec: dict[str, Any]
                ) -> tuple[str, str, dict[str, Any], dict[str, Any]]:
    experiment = Experiment.objects.get(pk=trial["experiment"])
    if not experiment.is_finished:
        run.state["waiting_for"] = experiment.pk
        return ("Still waiting for experiment.", "wait", {"experiment": experiment.pk}, {})
    if experiment.status != Experiment.Status.SUCCEEDED:
        trial["failed"] = True
        return (f"Experiment {experiment.pk} failed: {experiment.failure_reason}",
                "read_feedback", {"experiment": experiment.pk},
                {"failure": experiment.failure_reason})
    candidate, baseline = _goal_medians(experiment, spec)
    value = tuner.objective(candidate=candidate, baseline=baseline, direction=spec["direction"])
    if value is None:
        trial["failed"] = True
        return (f"Experiment {experiment.pk} reported no {spec['metric']}.", "read_feedback",
                {"experiment": experiment.pk}, {})
    trial.update(objective=value, candidate=candidate, baseline=baseline)
    return (f"{trial['params']}: {spec['metric']} median {candidate:.4g} vs baseline "
            f"{baseline:.4g} (objective {value:.3f}, lower is better).",
            "read_feedback", {"experiment": experiment.pk},
            {"candidate": candidate, "baseline": baseline, "objective": value})


def _tuner_submit(run: AgentRun, trials: list[dict[str, Any]], spec: dict[str, Any]
                  ) -> tuple[str, str, dict[str, Any], dict[str, Any]]:
    measured = [t for t in trials if t.get("objective") is not None and t.get("experiment")]
    best = min(measured, key=lambda t: t["objective"], default=None)
    if best is None or best["objective"] >= 1.0:
        run.state["finish"] = (AgentRun.Status.FAILED, "no configuration beat the baseline")
        return ("No configuration beat the baseline; nothing to submit.", "finish", {}, {})
    experiment = Experiment.objects.get(pk=best["experiment"])
    verdicts = [f["evidence"]["verdict"] for f in experiment.feedback.get("findings", [])
                if f["layer"] == "criteria"]
    improvement = (1 - best["objective"]) * 100
    change = change_submit(
        target=run.target, title=f"Tune {', '.join(f'{k}={v}' for k, v in best['params'].items())}",
        hypothesis=(f"Setting {best['params']} improves {spec['probe']}.{spec['metric']} "
                    f"({spec['direction']}) by {improvement:.1f}% over the base configuration."),
        evidence={"experiment": experiment.pk, "trials": trials, "criteria": verdicts,
                  "feedback": experiment.feedback.get("agent_text", "")},
        base_commit=run.base_commit, head_commit=best["commit"], author_label=f"run {run.pk}",
        requested_by=run.started_by, goal_version=run.goal_version, experiment=experiment,
    )
    run.changes.add(change)
    run_event(run_id=run.pk, kind="change",
              message=f"Change {change.pk} submitted ({change.get_status_display()}).",
              data={"change": change.pk})
    run.state["finish"] = (AgentRun.Status.SUCCEEDED, f"submitted change {change.pk}")
    return (f"Submitted the best configuration {best['params']} as change {change.pk}.",
            "submit_change", {"params": best["params"]}, {"change": change.pk})


# --- human controls ------------------------------------------------------------------------

def run_pause(*, run: AgentRun, user: User | AnonymousUser) -> AgentRun:
    return _transition(run, user, AgentRun.Status.RUNNING, AgentRun.Status.PAUSED, "paused")


def run_resume(*, run: AgentRun, user: User | AnonymousUser) -> AgentRun:
    run = _transition(run, user, AgentRun.Status.PAUSED, AgentRun.Status.RUNNING, "resumed")
    if not run.state.get("waiting_for"):
        with transaction.atomic():
            _enqueue_step(run)
    return run


def run_cancel(*, run: AgentRun, user: User | AnonymousUser) -> AgentRun:
    if not has_role(user, ENGINEER):
        raise DomainError("Only an engineer can cancel a run.")
    with transaction.atomic():
        locked = AgentRun.objects.select_for_update().get(pk=run.pk)
        if locked.is_finished:
            raise DomainError(f"The run already ended ({locked.status}).")
        _finish(locked, AgentRun.Status.CANCELLED, f"cancelled by {user.get_username()}")
        audit_record(actor=user, action="run.cancel", obj=locked)
    return locked


def _transition(run: AgentRun, user: User | AnonymousUser, old: str, new: str,
                verb: str) -> AgentRun:
    if not has_role(user, ENGINEER):
        raise DomainError(f"Only an engineer can have a run {verb}.")
    with transaction.atomic():
        if AgentRun.objects.filter(pk=run.pk, status=old).update(status=new) != 1:
            run.refresh_from_db()
            raise DomainError(f"The run is {run.status}, so it cannot be {verb}.")
        run_event(run_id=run.pk, kind="status", message=f"Run {verb} by {user.get_username()}.",
                  data={"status": new})
        audit_record(actor=user, action=f"run.{verb}", obj=run)
    run.refresh_from_db()
    return run


def run_wake(*, experiment_id: int) -> None:
    """An experiment finished: the runs waiting for it take their next step (a paused run
    takes it when resumed)."""
    with transaction.atomic():
        for run in AgentRun.objects.select_for_update().filter(
            status__in=[AgentRun.Status.RUNNING, AgentRun.Status.PAUSED],
            state__waiting_for=experiment_id,
        ):
            run.state.pop("waiting_for", None)
            run.save(update_fields=["state"])
            experiment = Experiment.objects.get(pk=experiment_id)
            run_event(run_id=run.pk, kind="experiment",
                      message=f"Experiment {experiment_id} {experiment.status}.",
                      data={"experiment": experiment_id, "status": experiment.status})
            if run.status == AgentRun.Status.RUNNING:
                _enqueue_step(run)


# --- human steering ------------------------------------------------------------------------

def _steerer(run: AgentRun, user: User | AnonymousUser) -> User:
    if not (has_role(user, ENGINEER) or has_role(user, REVIEWER)):
        raise DomainError("Only an engineer or a reviewer can steer a run.")
    if run.is_finished:
        raise DomainError(f"The run already ended ({run.status}): start a new one.")
    assert isinstance(user, User)
    return user


def run_message_add(*, run: AgentRun, user: User | AnonymousUser, text: str) -> RunMessage:
    """A message the agent receives at its next step."""
    author = _steerer(run, user)
    with transaction.atomic():
        message = RunMessage.objects.create(run=run, author=author, text=text)
        run_event(run_id=run.pk, kind="status",
                  message=f"Message from {author.get_username()}: {text[:500]}")
        audit_record(actor=author, action="run.message", obj=run, data={"message": message.pk})
    return message


def hypothesis_add(*, run: AgentRun, user: User | AnonymousUser, title: str,
                   rationale: str = "") -> Hypothesis:
    """A person's hypothesis in the run's ledger; the agent sees it at its next step."""
    author = _steerer(run, user)
    with transaction.atomic():
        hypothesis = Hypothesis.objects.create(run=run, title=title, rationale=rationale,
                                               author=author)
        run_event(run_id=run.pk, kind="status",
                  message=f"Hypothesis added by {author.get_username()}: {title}")
        audit_record(actor=author, action="run.hypothesis", obj=run,
                     data={"hypothesis": hypothesis.pk})
    return hypothesis


# --- recovery ------------------------------------------------------------------------------

STALLED_AFTER = timedelta(minutes=10)


def run_pause_for_error(*, run_id: int, error: BaseException) -> None:
    """Pause a run whose step raised something unexpected, with the reason on its page."""
    reason = f"a step failed: {type(error).__name__}: {str(error)[:300]}"
    with transaction.atomic():
        run = AgentRun.objects.select_for_update().filter(
            pk=run_id, status=AgentRun.Status.RUNNING).first()
        if run is not None:
            _pause(run, reason)


def runs_reap() -> list[int]:
    """Re-queue the next step of running runs that wait for nothing and have not moved for
    STALLED_AFTER (their step message was lost with a killed worker). Safe: a step number
    already taken is skipped. Returns the run ids re-queued."""
    quiet_since = timezone.now() - STALLED_AFTER
    stalled = list(AgentRun.objects.filter(status=AgentRun.Status.RUNNING)
                   .exclude(events__created_at__gte=quiet_since)
                   .values_list("pk", flat=True).distinct())
    requeued = []
    for pk in stalled:
        with transaction.atomic():
            run = (AgentRun.objects.select_for_update(skip_locked=True)
                   .filter(pk=pk, status=AgentRun.Status.RUNNING).first())
            if run is not None and run.state.get("waiting_for") is None:
                _enqueue_step(run)
                requeued.append(run.pk)
    return requeued
