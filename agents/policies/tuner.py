"""The built-in tuner policy: optuna ask/tell over the manifest's knobs, no model.

A step does one thing: read the pending trial's experiment, or try the next configuration
(a commit on the base with the knobs set, then an experiment), or submit the best one. The
study is rebuilt from the run's recorded trials (``run.state["trials"]``) at every step, so
the tuner keeps no process state and a step can run on any worker.

People steer it with messages, read at its next step: ``knob=value`` (try that next, several
knobs at once allowed), ``knob low-high`` (search only that range), ``stop`` (submit the best
so far once the pending trial is read). Anything else is answered on the run page with what
it understands.
"""

from __future__ import annotations

import dataclasses
import math
import re
import statistics
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import optuna

from agents.events import run_event
from agents.models import AgentRun, RunMessage
from agents.policies.outcome import Finish, StepOutcome
from agents.policies.shared import (
    Refusal,
    boundary,
    commit_worktree,
    criteria_verdicts,
    experiment_budget_left,
    fresh_worktree,
    pinned_manifest,
    request_experiment,
    submit_change,
)
from infraops import gitops
from infraops.errors import DomainError
from infraops.feedback.samples import MetricComparison
from infraops.knobs import knob_apply, knob_read, knob_values
from infraops.manifest import Knob
from infraops.models import Experiment
from reviews.diff_policy import path_violations

optuna.logging.set_verbosity(optuna.logging.WARNING)
# BruteForceSampler is marked experimental since optuna 3.1; its ask/tell use is stable.
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


@dataclass(frozen=True)
class Trial:
    """A knob configuration and its objective: candidate/baseline of the goal metric,
    oriented so that lower is better (None: failed or not measured yet)."""

    params: dict[str, str]
    objective: float | None


def _distribution(knob: Knob) -> optuna.distributions.BaseDistribution:
    if knob.values is not None or (knob.range is not None and knob.range[2] is not None):
        return optuna.distributions.CategoricalDistribution(knob_values(knob))
    assert knob.range is not None
    return optuna.distributions.FloatDistribution(knob.range[0], knob.range[1])


def space_size(knobs: Sequence[Knob]) -> float:
    """How many configurations exist (inf when a knob is continuous)."""
    size = 1.0
    for knob in knobs:
        dist = _distribution(knob)
        if isinstance(dist, optuna.distributions.CategoricalDistribution):
            size *= len(dist.choices)
        else:
            return math.inf
    return size


def suggest(knobs: Sequence[Knob], trials: Sequence[Trial], *, seed: int) -> dict[str, str]:
    """The next configuration to try, given every finished trial.

    A finite space is walked without repeats (brute force, shuffled by the seed); a continuous
    one is searched with TPE.
    """
    distributions = {knob.name: _distribution(knob) for knob in knobs}
    finite = math.isfinite(space_size(knobs))
    sampler: optuna.samplers.BaseSampler = (
        optuna.samplers.BruteForceSampler(seed=seed) if finite
        # The study is rebuilt every step: a fixed seed would repeat TPE's random start-up.
        else optuna.samplers.TPESampler(seed=seed + len(trials))
    )
    study = optuna.create_study(direction="minimize", sampler=sampler)
    for trial in trials:
        params: dict[str, Any] = {
            name: (float(value) if isinstance(distributions[name],
                                              optuna.distributions.FloatDistribution) else value)
            for name, value in trial.params.items() if name in distributions
        }
        study.add_trial(optuna.trial.create_trial(
            params=params, distributions={n: distributions[n] for n in params},
            value=trial.objective,
            state=(optuna.trial.TrialState.COMPLETE if trial.objective is not None
                   else optuna.trial.TrialState.FAIL),
        ))
    asked = study.ask(distributions)
    return {name: _format(value) for name, value in asked.params.items()}


def _format(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def objective(*, candidate: float | None, baseline: float | None, direction: str) -> float | None:
    """candidate/baseline oriented so that lower is better; None when unmeasured."""
    if candidate is None or not baseline:
        return None
    ratio = candidate / baseline
    if direction == "maximize":
        return 1 / ratio if ratio else None
    return ratio


# --- the policy ------------------------------------------------------------------------------
NOTHING_BEAT_THE_BASE = "nothing beat the base"


def prepare(run: AgentRun) -> None:
    return None


def think(prepared: None) -> None:
    return None


def spent(thought: None) -> tuple[int, Decimal]:
    return 0, Decimal(0)


def stuck(run: AgentRun) -> str:
    return ""  # the tuner's trials are bounded by the space and the experiment budget


def act(run: AgentRun, prepared: None, thought: None) -> StepOutcome:
    """One tuner action: read the last experiment, or try the next configuration, or submit."""
    spec = run.goal_version.spec
    knobs = turnable(run)
    if not knobs:
        text = ("None of the manifest's knobs is in a file this goal's boundary lets the run "
                f"edit ({', '.join(spec['boundary']['editable_paths']) or 'none'}).")
        return StepOutcome(text, "", finish=Finish(AgentRun.Status.FAILED, text))
    trials: list[dict[str, Any]] = run.state.setdefault("trials", [])
    _read_messages(run, knobs)
    pending = next((t for t in trials if t.get("objective") is None and not t.get("failed")), None)
    if pending is not None:
        return _read(run, pending, spec)
    again = next((t for t in trials if _measurable_again(run, t)), None)
    if again is not None:
        return _measure_again(run, again, spec)
    if not run.state.get("stop") and _more_to_try(run, knobs, trials, spec):
        return _try(run, knobs, trials, spec)
    return _submit(run, trials, spec)


def judged_probes(spec: dict[str, Any]) -> list[str]:
    """The goal's probe, then those its criteria read: every trial is judged on the criteria,
    so the configuration submitted comes with its verdicts, not with criteria left unmeasured
    (a goal may count instructions where its time is too noisy to judge)."""
    return list(dict.fromkeys([spec["probe"], *(c["probe"] for c in spec["criteria"])]))


def turnable(run: AgentRun) -> list[Knob]:
    """The manifest's knobs in files the run's boundary lets it edit: a change to any other
    would be refused at submission (a target whose goals each own part of its code, such as
    the demo's three cases, declares knobs for all of them)."""
    policy = boundary(run)
    return [knob for knob in pinned_manifest(run).knobs
            if not path_violations(knob.file, policy)]


def _call(name: str, arguments: dict[str, Any], ok: bool, content: str,
          data: dict[str, Any] | None = None, refusal: str | None = None) -> list[dict[str, Any]]:
    return [{"id": name, "name": name, "arguments": arguments, "ok": ok, "refusal": refusal,
             "malformed": False, "content": content, "data": data or {}}]


def _restricted(run: AgentRun, knobs: list[Knob]) -> list[Knob]:
    """The knobs with people's ranges applied (a value list filtered, a range clamped)."""
    ranges: dict[str, list[float]] = run.state.get("ranges", {})
    out = []
    for knob in knobs:
        bounds = ranges.get(knob.name)
        if bounds is None:
            out.append(knob)
        elif knob.values is not None or (knob.range is not None and knob.range[2] is not None):
            kept = tuple(v for v in knob_values(knob) if bounds[0] <= _number(v) <= bounds[1])
            out.append(dataclasses.replace(knob, values=kept, range=None))
        else:
            assert knob.range is not None
            out.append(dataclasses.replace(knob, range=(max(knob.range[0], bounds[0]),
                                                        min(knob.range[1], bounds[1]), None)))
    return out


def _number(value: str) -> float:
    try:
        return float(value)
    except ValueError:
        return math.nan  # not a number: outside every range


def shown(params: dict[str, Any]) -> str:
    """A configuration as people write it: batch_size=8, workers=2 (not a Python dict)."""
    return ", ".join(f"{name}={value}" for name, value in params.items()) or "the base"


def _in_space(knobs: list[Knob], params: dict[str, str]) -> bool:
    for knob in knobs:
        value = params.get(knob.name)
        if value is None:
            return False
        if knob.values is not None:
            if value not in knob.values:
                return False
        elif knob.range is not None and not knob.range[0] <= _number(value) <= knob.range[1]:
            return False
    return True


def _more_to_try(run: AgentRun, knobs: list[Knob], trials: list[dict[str, Any]],
                 spec: dict[str, Any]) -> bool:
    # The budget counts experiments run, not trials: the base configuration, drawn by the
    # search, is a trial that runs none.
    if experiment_budget_left(run) <= 0:
        return False
    if run.state.get("requested"):
        return True
    space = _restricted(run, knobs)
    tried = sum(1 for t in trials if _in_space(space, t["params"]))
    return tried < space_size(space)


def _try(run: AgentRun, knobs: list[Knob], trials: list[dict[str, Any]],
         spec: dict[str, Any]) -> StepOutcome:
    current = {k.name: knob_read(k, _base_text(run, k)) for k in knobs}
    requested: list[dict[str, str]] = run.state.get("requested", [])
    if requested:
        params = current | requested.pop(0)
        why = "asked for in a message"
    else:
        space = _restricted(run, knobs)
        history = [Trial(t["params"], t.get("objective")) for t in trials
                   if _in_space(space, t["params"])]
        params = current | suggest(space, history, seed=run.pk)
        why = "suggested by the search"
    trial: dict[str, Any] = {"number": len(trials) + 1, "params": params}
    trials.append(trial)
    arguments = {"params": params, "probes": [spec["probe"]], "why": why}
    if params == current:
        # The base configuration is the baseline itself: an A/A run would only measure noise.
        trial["objective"] = 1.0
        trial["commit"] = run.base_commit
        text = f"Configuration {shown(params)} is the current one: objective 1.0 by definition."
        return StepOutcome(text, "tuner.ask", _call("tuner.ask", arguments, True, text),
                           record={"params": params}, result={"objective": 1.0},
                           verdict="the base configuration: objective 1.0")
    commit = _commit_configuration(run, knobs, params)
    try:
        experiment = request_experiment(
            run, commit=commit, probes=judged_probes(spec),
            origin=f"run {run.pk}, trial {trial['number']}", describe=f"{shown(params)} vs base")
    except Refusal as exc:
        trial["failed"] = True
        refusal = "; ".join(exc.reasons)
        run_event(run_id=run.pk, kind="refusal", message=f"Edit refused: {refusal}")
        text = f"Refused configuration {shown(params)}: it breaks the boundary."
        return StepOutcome(text, "edit", _call("edit", arguments, False, text, refusal=refusal),
                           record={"params": params}, result={"violations": exc.reasons},
                           verdict="refused by the boundary")
    trial.update(commit=commit, experiment=experiment.pk)
    text = f"Trying {shown(params)}: experiment {experiment.pk} on commit {commit[:10]}."
    return StepOutcome(text, "run_experiment",
                       _call("run_experiment", arguments, True, text,
                             {"experiment": experiment.pk, "commit": commit}),
                       record={"params": params, "probes": [spec["probe"]]},
                       result={"experiment": experiment.pk, "commit": commit},
                       verdict=f"experiment {experiment.pk} queued",
                       experiment=experiment.pk, wait_for=experiment.pk)


def _base_text(run: AgentRun, knob: Knob) -> str:
    raw = gitops.read_file(run.target.clone_path, run.base_commit, knob.file)
    if raw is None:
        raise DomainError(f"Knob {knob.name}'s file {knob.file} is missing at the base commit.")
    return raw.decode()


def _commit_configuration(run: AgentRun, knobs: list[Knob], params: dict[str, str]) -> str:
    """A commit on top of the base with the knobs set to params (each trial starts clean)."""
    path = fresh_worktree(run)
    for knob in knobs:
        file = path / knob.file
        file.write_text(knob_apply(knob, file.read_text(), params[knob.name]))
    commit = commit_worktree(path, f"tuner: {shown(params)}")
    if commit == run.base_commit:
        raise DomainError(f"Setting {shown(params)} changed no file.")
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


def _read(run: AgentRun, trial: dict[str, Any], spec: dict[str, Any]) -> StepOutcome:
    experiment = Experiment.objects.get(pk=trial["experiment"])
    arguments = {"experiment": experiment.pk}
    if not experiment.is_finished:
        text = f"Still waiting for experiment {experiment.pk}."
        return StepOutcome(text, "wait", record=arguments, experiment=experiment.pk,
                           wait_for=experiment.pk, verdict="waiting")
    if experiment.lost:
        trial["failed"] = True
        trial.setdefault("lost", []).append(experiment.pk)
        text = (f"Experiment {experiment.pk} was lost to infrastructure, no evidence either way: "
                f"{experiment.failure_reason}")
        return StepOutcome(text, "read_feedback",
                           _call("read_feedback", arguments, False, text),
                           record=arguments, result={"lost": experiment.failure_reason},
                           verdict="lost to infrastructure", experiment=experiment.pk)
    if experiment.status != Experiment.Status.SUCCEEDED:
        trial["failed"] = True
        text = f"Experiment {experiment.pk} {experiment.status}: {experiment.failure_reason}"
        return StepOutcome(text, "read_feedback",
                           _call("read_feedback", arguments, False, text),
                           record=arguments, result={"failure": experiment.failure_reason},
                           verdict=f"experiment {experiment.status}", experiment=experiment.pk)
    candidate, baseline = _goal_medians(experiment, spec)
    value = objective(candidate=candidate, baseline=baseline, direction=spec["direction"])
    if value is None or candidate is None or baseline is None:
        trial["failed"] = True
        text = f"Experiment {experiment.pk} reported no {spec['metric']}."
        return StepOutcome(text, "read_feedback", _call("read_feedback", arguments, False, text),
                           record=arguments, verdict="no measurement", experiment=experiment.pk)
    trial.update(objective=value, candidate=candidate, baseline=baseline)
    text = (f"{shown(trial['params'])}: {spec['metric']} median {candidate:.4g} vs baseline "
            f"{baseline:.4g} (objective {value:.3f}, lower is better).")
    result = {"candidate": candidate, "baseline": baseline, "objective": value}
    return StepOutcome(text, "read_feedback", _call("read_feedback", arguments, True, text, result),
                       record=arguments, result=result, verdict=f"objective {value:.3f}",
                       experiment=experiment.pk)


# --- evidence lost to infrastructure -----------------------------------------------------------
# Issue 28: a run lost five of six experiments to a dropped database connection and still
# submitted a change picked from the one measurement left. A configuration whose experiment was
# lost (Experiment.lost) is measured again, once per start or resume of the run; while any
# stays lost, the tuner does not choose (nor say that nothing beat the base): it pauses and
# says how many were lost.

def _lost(trial: dict[str, Any]) -> bool:
    """The trial's last experiment was lost and nothing measured it since."""
    return bool(trial.get("lost")) and trial.get("objective") is None and bool(
        trial.get("failed")) and trial["lost"][-1] == trial.get("experiment")


def _measurable_again(run: AgentRun, trial: dict[str, Any]) -> bool:
    """Lost, and not yet measured again since the run started or was last resumed (Resume
    moves run.progress_floor past every experiment so far)."""
    return _lost(trial) and experiment_budget_left(run) > 0 and not any(
        pk > run.progress_floor for pk in trial.get("again", []))


def _measure_again(run: AgentRun, trial: dict[str, Any], spec: dict[str, Any]) -> StepOutcome:
    """Queue the lost trial's commit again; its next read takes the new experiment."""
    arguments = {"params": trial["params"], "probes": [spec["probe"]],
                 "why": f"experiment {trial['experiment']} was lost to infrastructure"}
    experiment = request_experiment(
        run, commit=trial["commit"], probes=judged_probes(spec),
        origin=f"run {run.pk}, trial {trial['number']} again",
        describe=f"{shown(trial['params'])} vs base, again: experiment {trial['experiment']} "
                 "was lost")
    trial.update(experiment=experiment.pk, failed=False)
    trial.setdefault("again", []).append(experiment.pk)
    text = (f"Measuring {shown(trial['params'])} again: experiment {trial['lost'][-1]} was lost "
            f"to infrastructure; experiment {experiment.pk} on commit {trial['commit'][:10]}.")
    return StepOutcome(text, "run_experiment",
                       _call("run_experiment", arguments, True, text,
                             {"experiment": experiment.pk, "commit": trial["commit"]}),
                       record=arguments, result={"experiment": experiment.pk},
                       verdict=f"experiment {experiment.pk} queued (again)",
                       experiment=experiment.pk, wait_for=experiment.pk)


def evidence_lost(run: AgentRun, trials: list[dict[str, Any]]) -> str:
    """Why the tuner will not choose yet, in words; '' when no trial's evidence is lost."""
    lost = [t for t in trials if _lost(t)]
    if not lost:
        return ""
    measured = sum(1 for t in trials if t.get("objective") is not None and t.get("experiment"))
    ids = ", ".join(str(t["experiment"]) for t in lost)
    then = ("Resume the run to measure them again." if experiment_budget_left(run) > 0 else
            "The experiment budget is spent: start a run of a goal version with more.")
    return (f"{len(lost)} of {len(trials)} configurations lost their experiments to "
            f"infrastructure (experiments {ids}; {measured} measured): nothing is submitted on "
            f"evidence that was lost. {then}")


def _submit(run: AgentRun, trials: list[dict[str, Any]], spec: dict[str, Any]) -> StepOutcome:
    lost = evidence_lost(run, trials)
    if lost:
        return StepOutcome(f"Not choosing: {lost}", "", verdict="evidence lost", pause=lost)
    measured = [t for t in trials if t.get("objective") is not None and t.get("experiment")]
    best = min(measured, key=lambda t: t["objective"], default=None)
    if best is None or best["objective"] >= 1.0:
        text = "No configuration beat the base; nothing to submit."
        return StepOutcome(text, "finish", _call("finish", {}, True, text),
                           verdict=NOTHING_BEAT_THE_BASE,
                           finish=Finish(AgentRun.Status.FINISHED, _submitted(run, None)))
    experiment = Experiment.objects.get(pk=best["experiment"])
    improvement = (1 - best["objective"]) * 100
    missed = _missed_criteria(experiment)
    # It beat the base, so it is submitted: the gate holds a change that misses a criterion,
    # and the reviewer reads by how much (a goal may ask more than this hardware gives).
    misses = (f" It misses {len(missed)} of {len(spec['criteria'])} acceptance criteria "
              f"({'; '.join(missed)}): the merge gate holds it." if missed else "")
    change = submit_change(
        run, title=f"Tune {shown(best['params'])}",
        hypothesis=(f"Setting {shown(best['params'])} improves {spec['probe']}.{spec['metric']} "
                    f"({spec['direction']}) by {improvement:.1f}% over the base configuration."
                    f"{misses}"),
        experiment=experiment, head_commit=best["commit"], evidence={"trials": trials})
    text = (f"Submitted the best configuration {shown(best['params'])} as change {change.pk}."
            f"{misses}")
    return StepOutcome(text, "submit_change",
                       _call("submit_change", {"params": best["params"]}, True, text,
                             {"change": change.pk}),
                       record={"params": best["params"]}, result={"change": change.pk},
                       verdict=f"change {change.pk} {change.status}", experiment=experiment.pk,
                       finish=Finish(AgentRun.Status.SUCCEEDED, _submitted(run, change.pk)
                                     + (f"; it misses {len(missed)} "
                                        + ("criterion" if len(missed) == 1 else "criteria")
                                        if missed else "")))


def _missed_criteria(experiment: Experiment) -> list[str]:
    """The criteria the experiment did not pass (failed, or not run), each with its
    measurement: what the merge gate will hold the change on."""
    return [f"'{verdict['criterion']}': {verdict['detail']}"
            for verdict in criteria_verdicts(experiment) if not verdict["passed"]]


def _submitted(run: AgentRun, change: int | None) -> str:
    """The ending's words: the change submitted (None: nothing beat the base), and who
    stopped the search where a person did (the best configuration so far is submitted)."""
    stopped_by = run.state.get("stopped_by")
    if change is None:
        return (f"stopped by {stopped_by}: {NOTHING_BEAT_THE_BASE}" if stopped_by
                else NOTHING_BEAT_THE_BASE)
    if stopped_by:
        return f"stopped by {stopped_by}, best so far submitted: change {change}"
    return f"submitted change {change}"


# --- people's messages ---------------------------------------------------------------------

_ASSIGN = re.compile(r"([A-Za-z_][\w.-]*)\s*=\s*([^\s,;]+)")
_RANGE = re.compile(r"([A-Za-z_][\w.-]*)\s*(?:=|:|\s)\s*(-?[\d.]+)\s*(?:-|\.\.|to)\s*(-?[\d.]+)")
_STOP = re.compile(r"\bstop\b", re.IGNORECASE)


def _read_messages(run: AgentRun, knobs: list[Knob]) -> None:
    """Turn people's new messages into the tuner's instructions; answer each on the page."""
    for message in RunMessage.objects.filter(run=run, delivered_at_step__isnull=True):
        answer = _understood(run, knobs, message.text)
        if run.state.get("stop"):
            run.state.setdefault("stopped_by", str(message.author))
        message.delivered_at_step = run.step_count + 1
        message.save(update_fields=["delivered_at_step"])
        run_event(run_id=run.pk, kind="status", data={"messages": [message.pk]},
                  message=f"Tuner read {message.author}'s message: {answer}")


def _understood(run: AgentRun, knobs: list[Knob], text: str) -> str:
    by_name = {k.name: k for k in knobs}
    said: list[str] = []
    problems: list[str] = []
    for name, low, high in _RANGE.findall(text):
        if name in by_name:
            lo, hi = sorted((float(low), float(high)))
            run.state.setdefault("ranges", {})[name] = [lo, hi]
            said.append(f"searching {name} only in {lo:g}-{hi:g}")
    ranged = {name for name, _, _ in _RANGE.findall(text)}
    params: dict[str, str] = {}
    for name, value in _ASSIGN.findall(text):
        if name in ranged:
            continue
        knob = by_name.get(name)
        if knob is None:
            problems.append(f"no knob {name!r} (knobs: {', '.join(by_name)})")
        elif not _in_space([knob], {name: value}):
            problems.append(f"{name}={value} is not one of its values")
        else:
            params[name] = value
    if params:
        run.state.setdefault("requested", []).append(params)
        said.append(f"trying {shown(params)} next")
    if _STOP.search(text):
        run.state["stop"] = True
        said.append("stopping after the pending trial; the best so far is submitted")
    if not said and not problems:
        return ("not understood. The tuner takes 'knob=value' (try it next), 'knob low-high' "
                "(search only that range) and 'stop'; knobs: " + ", ".join(by_name) + ".")
    return "; ".join(said + problems) + "."
