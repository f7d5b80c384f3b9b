"""Agent runs: the lifecycle. Start, one step at a time, pause, resume, cancel, steering,
recovery. What a step does is the policy's (agents/policies/); what it comes to is a typed
StepOutcome that _record applies here.

One step per Celery task: run_step locks the run, checks its budgets and progress, lets the
policy prepare, releases the lock while the policy thinks (a model call: Pause and Cancel
never wait on it), locks again, lets the policy act, records the Step and its events, then
ends, pauses, waits for an experiment (the experiment_finished receiver wakes it), retries
later or enqueues the next step after commit.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from functools import partial
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import F, Max
from django.utils import timezone

from agents.events import RUNS_GROUP, run_event
from agents.models import AgentRun, Hypothesis, RunMessage, Step
from agents.policies.outcome import StepOutcome
from agents.policies.registry import POLICIES
from agents.policies.shared import out_of_budget, remove_worktree
from infraops import gitops
from infraops.access import has_target_role, target_roles
from infraops.dbretry import TRANSIENT, retried
from infraops.diskspace import disk_full_reason, says_disk_full
from infraops.errors import QUEUE_DOWN, DomainError, queue_errors
from infraops.live import notify
from infraops.models import Experiment, Goal, Target
from infraops.roles import ENGINEER, REVIEWER
from infraops.services.audit import audit_record
from infraops.services.goals import goal_snapshot
from infraops.services.targets import target_refresh_manifest
from reviews.models import Change, ReviewDecision


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


def run_start(*, goal: Goal, user: User, follow_up: FollowUp | None = None,
              fetch: bool = True) -> AgentRun:
    """Pin the goal's current version, the manifest and the base commit; queue step one.
    A `follow_up` of a change starts with its reviewer's comments as the first message.

    `fetch=False` (a web request, a signal received in one): no git here. The run pins what
    the target's worker last fetched, and its first step, in a worker, fetches the upstream
    first and moves the base to its tip when it moved (_fetch_first): a repository that hangs
    holds a worker's task with its time limit, never a web thread (issue 28)."""
    if not has_target_role(user, goal.target_id, ENGINEER):
        raise DomainError(f"Only an engineer can start a run on {goal.target.name}.")
    if goal.policy == Goal.Policy.LLM and not (
            settings.OPENAI_BASE_URL and (goal.model_name or settings.INFRAOPS_MODEL)):
        raise DomainError("The LLM policy needs OPENAI_BASE_URL and a model (INFRAOPS_MODEL, "
                          "or the goal's model): set them, or choose the built-in tuner.")
    _require_fetched(goal.target)
    if fetch:
        target = target_refresh_manifest(target=goal.target)
    else:
        target = Target.objects.get(pk=goal.target_id)
    manifest = target.manifest()
    if manifest is None:
        raise DomainError(f"{target.name}'s infraops.toml is invalid: "
                          + "; ".join(target.manifest_errors))
    if goal.policy == Goal.Policy.TUNER and not manifest.knobs:
        raise DomainError(f"{target.name}'s manifest declares no [[knob]] for the tuner to turn.")
    _require_task_queue()
    run: AgentRun | None = None
    try:
        with transaction.atomic():
            version = goal_snapshot(goal=goal, user=user)
            run = AgentRun.objects.create(
                goal_version=version, target=target, policy=goal.policy, started_by=user,
                base_commit=target.manifest_commit, manifest_sha256=target.manifest_sha256,
                follows_change=follow_up.change if follow_up else None,
                state={} if fetch else {FETCH_FIRST: True},
            )
            run_event(run_id=run.pk, kind="status",
                      message=f"Run started by {user.get_username()} on goal "
                              f"{goal.name!r} v{version.number}, base {run.base_commit[:10]}."
                              + (follow_up.why() if follow_up else ""))
            audit_record(actor=user, action="run.start", obj=run,
                         data={"goal_version": version.pk}
                         | (follow_up.record() if follow_up else {}))
            if follow_up is not None:
                _message_create(run, follow_up.reviewer, follow_up.text)
            notify(RUNS_GROUP, {"type": "runs.started"})
            _enqueue_step(run)
    except queue_errors():
        if run is None or run.pk is None or not AgentRun.objects.filter(pk=run.pk).exists():
            raise
        # Redis went away between the check and the send, after the commit: the run exists
        # (and is in the append-only audit log), so it is paused with the reason, not hidden.
        _pause(run, "the task queue (Redis) was not answering when the run started: "
                    "resume it once Redis is back")
        raise DomainError(f"{QUEUE_DOWN} when run {run.pk} was created: it is paused; "
                          "resume it once Redis is back.") from None
    return run


FETCH_FIRST = "fetch_first"  # run.state: step one fetches the upstream before anything else


def _fetch_first(run_id: int) -> None:
    """Step one of a run started without fetching: fetch the upstream (in this worker) and,
    when its base branch moved and its manifest is valid, pin the run to the new tip before
    the policy does anything; otherwise the run goes on from what it pinned, saying why."""
    run = AgentRun.objects.select_related("target").filter(pk=run_id).first()
    if run is None or not run.state.get(FETCH_FIRST) or run.step_count:
        return  # gone (the step says so), or nothing to fetch
    moved = ""
    try:
        target = target_refresh_manifest(target=run.target)
    except DomainError as exc:
        note = (f"Fetching the upstream failed ({exc}): the run goes on from "
                f"{run.base_commit[:10]}, the base its target last fetched.")
    else:
        manifest = target.manifest()
        if target.manifest_commit == run.base_commit:
            note = f"Fetched the upstream: the base {run.base_commit[:10]} is its tip."
        elif manifest is None or (run.policy == Goal.Policy.TUNER and not manifest.knobs):
            note = (f"Fetched the upstream: its tip {target.manifest_commit[:10]} has "
                    f"{'no valid infraops.toml' if manifest is None else 'no [[knob]]'}, so "
                    f"the run goes on from {run.base_commit[:10]}.")
        else:
            moved = target.manifest_commit
            note = (f"Fetched the upstream: the base branch moved since the target was last "
                    f"fetched, so the run starts from its tip {moved[:10]} (was "
                    f"{run.base_commit[:10]}).")
    with transaction.atomic():
        locked = AgentRun.objects.select_for_update().filter(pk=run_id).first()
        if locked is None or not locked.state.get(FETCH_FIRST) or locked.step_count:
            return  # another delivery of this step did it
        run = locked
        run.state.pop(FETCH_FIRST)
        fields = ["state"]
        if moved:
            run.base_commit, run.manifest_sha256 = moved, target.manifest_sha256
            fields += ["base_commit", "manifest_sha256"]
        run.save(update_fields=fields)
        run_event(run_id=run.pk, kind="status", message=note,
                  data={"base_commit": run.base_commit})


def _require_fetched(target: Target) -> None:
    """A run starts from a fetched repository; the git work is a worker's, never this
    request's (issue 28)."""
    if target.fetch_status == Target.Fetch.FETCHING:
        raise DomainError(f"{target.name}'s repository is still being fetched by a worker: "
                          "a run can start once it is ready (its page says so).")
    if target.fetch_status == Target.Fetch.FAILED:
        raise DomainError(f"{target.name}'s repository could not be fetched: "
                          f"{target.fetch_error} Fix the target (or refresh it) first.")


def _require_task_queue() -> None:
    """Fail before anything is created when the broker cannot take the first step."""
    from agents.tasks import agent_step

    try:
        with agent_step.app.connection_for_write() as connection:
            connection.ensure_connection(max_retries=1, interval_start=0, interval_step=1,
                                         timeout=5)
    except queue_errors():
        raise DomainError(f"{QUEUE_DOWN}; nothing was started. Try again once Redis is "
                          "back.") from None


def run_step(*, run_id: int, number: int) -> AgentRun | None:
    """Take step `number` of the run, unless it is not running or that step was taken.

    A thought that arrives after the run was paused, cancelled or stepped meanwhile is not
    acted on, but what it cost (a model's tokens) still counts against the budget.

    A dropped database connection takes the step again from its start on a new connection
    (infraops.dbretry): each of its transactions rolls back whole, a step number already
    taken is skipped, and a thought whose act was lost with the connection still counts its
    cost. The policy thinks again on what the run holds then (the LLM's edits stay in the
    worktree it reads), rather than replaying tool calls that may have run already.
    """
    return retried(partial(_step, run_id, number), what=f"run {run_id} step {number + 1}")


def _step(run_id: int, number: int) -> AgentRun | None:
    if number == 0:
        _fetch_first(run_id)
    with transaction.atomic():
        run = _locked_for_step(run_id, number)
        if run is None or run.is_finished or run.status == AgentRun.Status.PAUSED:
            return run
        try:
            prepared = POLICIES[run.policy].prepare(run)
        except (DomainError, gitops.GitError) as exc:
            _fail_unless_disk_full(run, exc)
            return run
    thought = prepared.think()
    try:
        with transaction.atomic():
            run = _locked_for_step(run_id, number, checks=False)
            if run is None or run.status != AgentRun.Status.RUNNING:
                _count_dropped(run_id, thought.spent(), LATE_THOUGHT)
                return run
            try:
                outcome = thought.act(run)
            except (DomainError, gitops.GitError) as exc:
                _fail_unless_disk_full(run, exc)
                return run
            _record(run, outcome)
    except TRANSIENT:
        retried(partial(_count_dropped, run_id, thought.spent(), LOST_THOUGHT, number=number),
                what=f"run {run_id} step {number + 1} cost")
        raise
    return run


def _fail_unless_disk_full(run: AgentRun, error: DomainError | gitops.GitError) -> None:
    """A step that cannot go on fails the run, unless a disk was full: that is the host's
    trouble, not the run's, so it pauses with the reason until an engineer frees space and
    resumes it (the step is then taken again)."""
    full = disk_full_reason(error)
    if full is not None:
        _pause(run, full)
    else:
        _finish(run, AgentRun.Status.FAILED, str(error))


LATE_THOUGHT = ("The model's reply arrived after the run was paused or stopped: it was not "
                "acted on, and its {tokens} tokens count against the budget.")
LOST_THOUGHT = ("The database connection dropped while step {step} was recorded: the step is "
                "taken again, and the {tokens} tokens of the reply it lost count against the "
                "budget.")


def _count_dropped(run_id: int, cost: tuple[int, Decimal], message: str, *,
                   number: int | None = None) -> None:
    """Count a thought that was not acted on; with `number`, only while that step is still
    due (its act did not commit after all)."""
    tokens, usd = cost
    if not tokens and not usd:
        return
    runs = AgentRun.objects.filter(pk=run_id)
    if number is not None:
        runs = runs.filter(step_count=number)
    with transaction.atomic():
        if runs.update(tokens_used=F("tokens_used") + tokens, cost_usd=F("cost_usd") + usd):
            run_event(run_id=run_id, kind="status",
                      message=message.format(tokens=tokens, step=(number or 0) + 1))


def _locked_for_step(run_id: int, number: int, *, checks: bool = True) -> AgentRun | None:
    """The run under its row lock when step `number` is due; with checks, a run out of budget
    ends and a stuck one pauses here (the returned run then says so)."""
    run = (AgentRun.objects.select_for_update().select_related("goal_version", "target")
           .filter(pk=run_id).first())
    if run is None or run.status != AgentRun.Status.RUNNING or run.step_count != number:
        return None
    if run.waiting_for_id is not None:
        return None
    if not checks:
        return run
    stop = _budget_exhausted(run)
    if stop:
        ended = out_of_budget(run, stop)
        _finish(run, ended.status, ended.reason)
        return run
    stuck = POLICIES[run.policy].stuck(run)
    if stuck:
        _pause(run, stuck)
    return run


_FIELDS = ["step_count", "state", "experiment_count", "tokens_used", "cost_usd",
           "malformed_in_row", "branch", "waiting_for", "provider_failing_since"]


def _record(run: AgentRun, outcome: StepOutcome) -> None:
    """Apply one step's outcome: a retry re-schedules the step with nothing recorded, an
    outcome that does not count only ends or pauses the run; otherwise the Step row and its
    event, then end, pause, wait or go on."""
    if outcome.retry is not None:
        run.save(update_fields=_FIELDS)
        wait = outcome.retry
        if not wait.quiet:
            run_event(run_id=run.pk, kind="wait", message=outcome.summary,
                      data={"retry_in": wait.seconds, "attempt": wait.attempt,
                            "reason": wait.reason[:500]})
        _enqueue_step(run, countdown=wait.seconds)
        return
    if not outcome.counts:
        run.save(update_fields=_FIELDS)
        if outcome.finish is not None:
            _finish(run, outcome.finish.status, outcome.finish.reason)
        elif outcome.pause is not None:
            _pause(run, outcome.pause)
        return
    run.step_count += 1
    Step.objects.create(run=run, number=run.step_count, summary=outcome.summary,
                        tool=outcome.tool[:100], arguments=outcome.record, result=outcome.result,
                        calls=outcome.calls, verdict=outcome.verdict[:300],
                        experiment_id=outcome.experiment)
    run.waiting_for_id = outcome.wait_for
    run.save(update_fields=_FIELDS)
    data: dict[str, Any] = {"tool": outcome.tool}
    if outcome.result.get("change"):
        data["change"] = outcome.result["change"]
    run_event(run_id=run.pk, kind="step", message=f"Step {run.step_count}: {outcome.summary}",
              data=data)
    if outcome.finish is not None:
        _finish(run, outcome.finish.status, outcome.finish.reason)
    elif outcome.pause is not None:
        _pause(run, outcome.pause)
    elif run.waiting_for_id is None:
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
    """End the run: its queued experiments are cancelled, its worktree removed."""
    from infraops.experiments.services import experiment_cancel

    run.status = status
    run.stop_reason = reason
    run.finished_at = timezone.now()
    run.waiting_for = None
    run.save(update_fields=["status", "stop_reason", "finished_at", "waiting_for"])
    run_event(run_id=run.pk, kind="status", message=f"Run {status}: {reason}",
              data={"status": status})
    for experiment in run.experiments.filter(status=Experiment.Status.QUEUED):
        if experiment_cancel(experiment=experiment, reason=f"run {run.pk} ended ({status})"):
            run_event(run_id=run.pk, kind="experiment", data={"experiment": experiment.pk},
                      message=f"Experiment {experiment.pk} cancelled: the run ended.")
    remove_worktree(run)


# --- human controls ------------------------------------------------------------------------

def run_pause(*, run: AgentRun, user: User) -> AgentRun:
    return _transition(run, user, AgentRun.Status.RUNNING, AgentRun.Status.PAUSED, "paused")


def run_resume(*, run: AgentRun, user: User) -> AgentRun:
    """Resume a paused run: the model endpoint gets a fresh retry window and the 'no
    progress' check a fresh allowance (it reads only experiments after this point)."""
    run = _transition(run, user, AgentRun.Status.PAUSED, AgentRun.Status.RUNNING, "resumed")
    with transaction.atomic():
        floor = run.experiments.aggregate(last=Max("pk"))["last"] or 0
        AgentRun.objects.filter(pk=run.pk).update(provider_failing_since=None,
                                                  progress_floor=floor)
        run.refresh_from_db()
        if run.waiting_for_id is None:
            _enqueue_step(run)
    return run


def run_cancel(*, run: AgentRun, user: User) -> AgentRun:
    if not has_target_role(user, run.target_id, ENGINEER):
        raise DomainError(f"Only an engineer can cancel a run on {run.target.name}.")
    with transaction.atomic():
        locked = AgentRun.objects.select_for_update().get(pk=run.pk)
        if locked.is_finished:
            raise DomainError(f"The run already ended ({locked.status}).")
        _finish(locked, AgentRun.Status.CANCELLED, f"cancelled by {user.get_username()}")
        audit_record(actor=user, action="run.cancel", obj=locked)
    return locked


def _transition(run: AgentRun, user: User, old: str, new: str,
                verb: str) -> AgentRun:
    if not has_target_role(user, run.target_id, ENGINEER):
        raise DomainError(f"Only an engineer can have a run {verb} on {run.target.name}.")
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
    takes it when resumed). One that failed because a worker's disk was full pauses them
    instead, with its reason: the run's next trials would meet the same full disk. Safe twice: a
    run woken waits for nothing any more."""
    retried(partial(_wake, experiment_id), what=f"runs waiting for experiment {experiment_id}")


def _wake(experiment_id: int) -> None:
    with transaction.atomic():
        for run in AgentRun.objects.select_for_update().filter(
            status__in=[AgentRun.Status.RUNNING, AgentRun.Status.PAUSED],
            waiting_for_id=experiment_id,
        ):
            run.waiting_for = None
            run.save(update_fields=["waiting_for"])
            experiment = Experiment.objects.get(pk=experiment_id)
            run_event(run_id=run.pk, kind="experiment",
                      message=f"Experiment {experiment_id} {experiment.status}.",
                      data={"experiment": experiment_id, "status": experiment.status})
            if run.status != AgentRun.Status.RUNNING:
                continue
            if (experiment.status == Experiment.Status.FAILED
                    and says_disk_full(experiment.failure_reason)):
                _pause(run, f"experiment {experiment_id} failed on a full disk: "
                            f"{experiment.failure_reason[:300]}. Free space on its worker, "
                            "then resume the run.")
            else:
                _enqueue_step(run)


def _wake_missed() -> list[int]:
    """Wake runs still waiting for an experiment that finished: its wake was lost (the
    database dropped the connection that sent it, say). Returns the running ones woken."""
    waiting = list(AgentRun.objects.active().filter(
        waiting_for__status__in=[Experiment.Status.SUCCEEDED, Experiment.Status.FAILED,
                                 Experiment.Status.CANCELLED],
    ).values_list("pk", "waiting_for_id", "status"))
    for experiment_id in {experiment for _, experiment, _ in waiting}:
        run_wake(experiment_id=experiment_id)
    return [pk for pk, _, status in waiting if status == AgentRun.Status.RUNNING]


# --- human steering ------------------------------------------------------------------------

def _steerer(run: AgentRun, user: User) -> User:
    if not target_roles(user, run.target_id) & {ENGINEER, REVIEWER}:
        raise DomainError(f"Only an engineer or a reviewer can steer a run on {run.target.name}.")
    if run.is_finished:
        raise DomainError(f"The run already ended ({run.status}): start a new one.")
    assert isinstance(user, User)
    return user


def run_message_add(*, run: AgentRun, user: User, text: str) -> RunMessage:
    """A message the agent receives at its next step."""
    author = _steerer(run, user)
    with transaction.atomic():
        message = _message_create(run, author, text)
    return message


def _message_create(run: AgentRun, author: User, text: str,
                    data: dict[str, Any] | None = None) -> RunMessage:
    """The message row, its line in the run's log and its audit entry (in the caller's
    transaction)."""
    message = RunMessage.objects.create(run=run, author=author, text=text)
    run_event(run_id=run.pk, kind="status", data={"messages": [message.pk]},
              message=f"Message from {author.get_username()}: {text[:500]}")
    audit_record(actor=author, action="run.message", obj=run,
                 data={"message": message.pk} | (data or {}))
    return message


# --- a reviewer's request for changes ------------------------------------------------------

@dataclass(frozen=True)
class FollowUp:
    """A run started because a reviewer requested changes on a change whose run had ended."""

    change: Change
    reviewer: User
    text: str

    def why(self) -> str:
        return (f" A follow-up of change {self.change.pk}: {self.reviewer.get_username()} "
                "requested changes, and the comments are its first message.")

    def record(self) -> dict[str, Any]:
        return {"follows_change": self.change.pk, "requested_by": self.reviewer.get_username()}


def changes_requested_deliver(*, decision_id: int) -> dict[str, Any]:
    """A reviewer requested changes: the comments reach an agent. The run that wrote the
    change gets them as a message while it runs or is paused. Once it ended, a run already
    active on the same goal gets them as a message (_to_goal_run); with none, a follow-up run
    on the goal starts with them as its first message, in the name of the person who started
    the first run, so the reviewer stays free to review what it submits. Where they went (or
    why nowhere) is written on the decision, for the change page."""
    decision = ReviewDecision.objects.select_related("change__goal", "reviewer").get(
        pk=decision_id)
    delivery = _to_live_run(decision) or _to_goal_run(decision) or _to_follow_up(decision)
    ReviewDecision.objects.filter(pk=decision.pk).update(delivery=delivery)
    return delivery


def _to_live_run(decision: ReviewDecision) -> dict[str, Any] | None:
    """The message to the change's run, when it has not ended (checked under its row lock,
    so a run that ends meanwhile gets a follow-up instead); None otherwise."""
    with transaction.atomic():
        run = (AgentRun.objects.select_for_update(of=("self",)).filter(changes=decision.change_id)
               .order_by("-created_at").first())
        if run is None or run.is_finished:
            return None
        _message_create(run, decision.reviewer, _request_text(decision),
                        data={"decision": decision.pk})
    return {"outcome": "message", "run": run.pk, "run_status": run.status}


def _ended_run(change: Change) -> tuple[AgentRun | None, dict[str, Any]]:
    """The change's own run, which has ended, and the delivery's words about it."""
    ended = change.runs.order_by("-created_at").first()
    return ended, ({"ended_run": ended.pk, "ended_status": ended.status} if ended else {})


def _to_goal_run(decision: ReviewDecision) -> dict[str, Any] | None:
    """The comments as a message to a run already active on the change's goal, the change's
    own run having ended: a follow-up beside it would compete with it for the workers, and
    their changes would conflict. A run that follows this change is where an earlier
    delivery of this decision went (its record lost with a killed process): nothing is sent
    again. None when no run is active on the goal, or there is nothing to say."""
    change = decision.change
    text = _comments_text(decision)
    if change.goal_id is None or text is None:
        return None
    _, before = _ended_run(change)
    active = AgentRun.objects.select_for_update(of=("self",)).filter(
        goal_version__goal_id=change.goal_id, status__in=AgentRun.active_statuses())
    with transaction.atomic():
        run = active.filter(follows_change=change).first()
        if run is not None:
            return before | {"outcome": "follow_up", "run": run.pk, "run_status": run.status}
        run = active.order_by("-created_at").first()
        if run is None:
            return None
        _message_create(run, decision.reviewer, text, data={"decision": decision.pk})
    return before | {"outcome": "message", "run": run.pk, "run_status": run.status,
                     "same_goal": True}


def _to_follow_up(decision: ReviewDecision) -> dict[str, Any]:
    change = decision.change
    ended, before = _ended_run(change)
    text = _comments_text(decision)
    starter = change.requested_by or (ended.started_by if ended else None)
    if change.goal is None or starter is None:
        reason = "the change has no goal and starter to start a follow-up run for"
    elif text is None:
        reason = "there was no comment to send: say what to change, and start a run"
    else:
        try:
            run = run_start(goal=change.goal, user=starter, fetch=False,
                            follow_up=FollowUp(change=change, reviewer=decision.reviewer,
                                               text=text))
        except DomainError as exc:
            reason = str(exc)
        else:
            return before | {"outcome": "follow_up", "run": run.pk, "run_status": run.status}
    return before | {"outcome": "undelivered", "reason": reason}


def _request_text(decision: ReviewDecision) -> str:
    """The request as the agent reads it."""
    change = decision.change
    return (f"Reviewer {decision.reviewer.get_username()} requested changes on change "
            f"{change.pk} ({change.title}): {decision.comment.strip() or '(no comment)'}")


def _comments_text(decision: ReviewDecision) -> str | None:
    """The request and the comments on the current diff's lines, one a line, for a run other
    than the change's own (which reads the line comments on its own at its next step); None
    when the reviewer said nothing at all."""
    change = decision.change
    lines = [f"- {c.path} line {c.line} ({c.side}): {c.text}"
             for c in change.comments.filter(diff_sha256=change.diff_sha256)]
    if not decision.comment.strip() and not lines:
        return None
    return "\n".join([_request_text(decision), *lines])


def hypothesis_add(*, run: AgentRun, user: User, title: str,
                   rationale: str = "") -> Hypothesis:
    """A person's hypothesis in the run's ledger; the agent sees it at its next step."""
    author = _steerer(run, user)
    with transaction.atomic():
        hypothesis = Hypothesis.objects.create(run=run, title=title, rationale=rationale,
                                               author=author)
        run_event(run_id=run.pk, kind="status", data={"ledger": True},
                  message=f"Hypothesis added by {author.get_username()}: {title}")
        audit_record(actor=author, action="run.hypothesis", obj=run,
                     data={"hypothesis": hypothesis.pk})
    return hypothesis


# --- recovery ------------------------------------------------------------------------------

STALLED_AFTER = timedelta(minutes=10)


def run_pause_for_error(*, run_id: int, error: BaseException) -> None:
    """Pause a run whose step raised something unexpected, with the reason on its page (a full
    disk said as such)."""
    reason = disk_full_reason(error) or f"a step failed: {type(error).__name__}: {str(error)[:300]}"

    def pause() -> None:
        with transaction.atomic():
            run = AgentRun.objects.select_for_update().filter(
                pk=run_id, status=AgentRun.Status.RUNNING).first()
            if run is not None:
                _pause(run, reason)

    retried(pause, what=f"run {run_id} pause")


def runs_reap() -> list[int]:
    """Re-queue the next step of running runs that wait for nothing when their step message
    is lost: at once when the worker that took the step is gone (killed, or restarted under
    the same name: agents.tasks records which worker runs a step), and otherwise after
    STALLED_AFTER without an event (a message lost some other way). Safe: a step number
    already taken is skipped. Returns the run ids re-queued."""
    import logging

    from redis.exceptions import RedisError

    from agents import tasks

    requeued = []
    try:
        orphans = tasks.orphaned_steps()
    except RedisError:
        logging.getLogger(__name__).warning("cannot read which steps run", exc_info=True)
        orphans = {}
    for pk, (number, record) in orphans.items():
        with transaction.atomic():
            run = (AgentRun.objects.select_for_update(skip_locked=True)
                   .filter(pk=pk, status=AgentRun.Status.RUNNING).first())
            if run is not None and run.waiting_for_id is None and run.step_count == number:
                run_event(run_id=run.pk, kind="status",
                          message=f"Step {number + 1} is taken again: the worker that had "
                                  "it is gone.")
                _enqueue_step(run)
                requeued.append(run.pk)
        tasks.forget_step(pk, record)
    requeued += _wake_missed()
    quiet_since = timezone.now() - STALLED_AFTER
    stalled = list(AgentRun.objects.filter(status=AgentRun.Status.RUNNING)
                   .exclude(events__created_at__gte=quiet_since)
                   .exclude(pk__in=requeued)
                   .values_list("pk", flat=True).distinct())
    for pk in stalled:
        with transaction.atomic():
            run = (AgentRun.objects.select_for_update(skip_locked=True)
                   .filter(pk=pk, status=AgentRun.Status.RUNNING).first())
            if run is not None and run.waiting_for_id is None:
                _enqueue_step(run)
                requeued.append(run.pk)
    return requeued
