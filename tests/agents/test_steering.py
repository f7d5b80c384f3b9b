"""Steering without leaks: Cancel cancels the queued experiments, a reply dropped by a pause
still counts, the tuner reads people's messages and ends "finished" when nothing beat the
base, progress counts correctness fixes, Resume gives a fresh allowance, submit_change
submits the worktree its experiment ran."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from agents import services
from agents.models import AgentRun, RunMessage
from agents.policies import llm as llm_policy
from agents.policies import tuner
from agents.scripted.endpoint import OpenAIStub, completion
from agents.services import run_message_add, run_pause, run_start, run_step
from infraops import gitops
from infraops.knobs import knob_read
from infraops.models import Boundary, Experiment, Goal
from tests.agents.test_llm_runs import call, step
from tests.factories import ExperimentFactory

pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")


def tuner_run(goal: Goal, user: User, capture: Any) -> AgentRun:
    with capture(execute=False):
        return run_start(goal=goal, user=user)


def tuner_step(run: AgentRun, capture: Any) -> AgentRun:
    with capture(execute=False):
        run_step(run_id=run.pk, number=run.step_count)
    run.refresh_from_db()
    return run


def batch_size_at(run: AgentRun, commit: str) -> str:
    raw = gitops.read_file(run.target.clone_path, commit, "config/serving.toml")
    assert raw is not None
    return next(line for line in raw.decode().splitlines() if line.startswith("batch_size"))


# --- cancel ----------------------------------------------------------------------------------

def test_cancel_also_cancels_the_runs_queued_experiment(
    example_goal: Goal, engineer: User, django_capture_on_commit_callbacks: Any,
) -> None:
    run = tuner_run(example_goal, engineer, django_capture_on_commit_callbacks)
    run = tuner_step(run, django_capture_on_commit_callbacks)
    if run.waiting_for_id is None:
        # The search, seeded by the run's id, drew the base configuration first: that trial
        # needs no experiment, and the walk never draws it again.
        assert run.state["trials"][0]["objective"] == 1.0
        run = tuner_step(run, django_capture_on_commit_callbacks)
    experiment = run.experiments.get()
    assert experiment.status == Experiment.Status.QUEUED and run.waiting_for_id == experiment.pk

    services.run_cancel(run=run, user=engineer)

    experiment.refresh_from_db()
    assert experiment.status == Experiment.Status.CANCELLED
    assert run.events.filter(message=f"Experiment {experiment.pk} cancelled: the run "
                                     "ended.").exists()


# --- the tuner reads messages -----------------------------------------------------------------

def test_the_tuner_tries_the_value_a_person_asks_for_next(
    example_goal: Goal, engineer: User, django_capture_on_commit_callbacks: Any,
) -> None:
    run = tuner_run(example_goal, engineer, django_capture_on_commit_callbacks)
    message = run_message_add(run=run, user=engineer, text="Please try batch_size=16 first.")

    run = tuner_step(run, django_capture_on_commit_callbacks)

    experiment = run.experiments.get()
    assert batch_size_at(run, experiment.candidate_commit) == "batch_size = 16"
    message.refresh_from_db()
    assert message.delivered_at_step == 1
    assert run.events.filter(message__contains="trying batch_size=16 next").exists()


def test_the_tuner_says_what_it_did_not_understand(
    example_goal: Goal, engineer: User, django_capture_on_commit_callbacks: Any,
) -> None:
    run = tuner_run(example_goal, engineer, django_capture_on_commit_callbacks)
    run_message_add(run=run, user=engineer, text="be clever about it")
    run_message_add(run=run, user=engineer, text="batch_size=3 and warps=4")

    run = tuner_step(run, django_capture_on_commit_callbacks)

    said = [e.message for e in run.events.filter(message__startswith="Tuner read")]
    assert "not understood" in said[0] and "'knob=value'" in said[0]
    assert "batch_size=3 is not one of its values" in said[1]
    assert "no knob 'warps' (knobs: batch_size)" in said[1]
    assert not RunMessage.objects.filter(run=run, delivered_at_step__isnull=True).exists()


def test_a_range_restricts_the_search_to_it(
    example_goal: Goal, engineer: User, django_capture_on_commit_callbacks: Any,
) -> None:
    run = tuner_run(example_goal, engineer, django_capture_on_commit_callbacks)
    run_message_add(run=run, user=engineer, text="only batch_size 8-32 please")

    run = tuner_step(run, django_capture_on_commit_callbacks)

    assert run.state["ranges"] == {"batch_size": [8.0, 32.0]}
    knobs = tuner._restricted(run, list(tuner.pinned_manifest(run).knobs))
    assert knobs[0].values == ("8", "16", "32")
    trial = run.state["trials"][0]
    assert trial["params"]["batch_size"] in ("8", "16", "32")


def test_stop_ends_the_search_and_nothing_better_finishes_not_failed(
    example_goal: Goal, engineer: User, django_capture_on_commit_callbacks: Any,
) -> None:
    run = tuner_run(example_goal, engineer, django_capture_on_commit_callbacks)
    run_message_add(run=run, user=engineer, text="stop after this")

    run = tuner_step(run, django_capture_on_commit_callbacks)

    assert run.status == AgentRun.Status.FINISHED
    assert run.stop_reason == f"stopped by {engineer}: nothing beat the base"
    assert not run.experiments.exists()


def test_a_person_s_stop_submits_the_best_so_far_and_the_run_page_reads_stopped(
    example_goal: Goal, engineer: User, django_capture_on_commit_callbacks: Any, client: Client,
) -> None:
    """'stop' ended a run 'succeeded' on its own page as if the search had reached its end;
    the ending's words and the status say that a person stopped it."""
    run = tuner_run(example_goal, engineer, django_capture_on_commit_callbacks)
    params = {"batch_size": "16"}
    commit = tuner._commit_configuration(run, tuner.turnable(run), params)
    experiment = ExperimentFactory(
        target=run.target, candidate_commit=commit, baseline_commit=run.base_commit,
        status=Experiment.Status.SUCCEEDED, feedback={"findings": []})
    AgentRun.objects.filter(pk=run.pk).update(state={"trials": [
        {"number": 1, "params": params, "objective": 0.8, "commit": commit,
         "experiment": experiment.pk}]})
    run_message_add(run=run, user=engineer, text="stop")

    run = tuner_step(run, django_capture_on_commit_callbacks)
    client.force_login(engineer)
    page = client.get(f"/runs/{run.pk}/").content.decode()

    change = run.changes.get()
    assert run.stop_reason == f"stopped by {engineer}, best so far submitted: change {change.pk}"
    badge = page[page.index('<span id="run-status"'):]
    assert badge.startswith('<span id="run-status" class="badge stopped"')
    assert badge[:badge.index("</span>")].endswith(">stopped")


def test_a_tuner_run_whose_trials_all_lose_finishes_nothing_beat_the_base(
    example_goal: Goal, engineer: User, django_capture_on_commit_callbacks: Any,
) -> None:
    run = tuner_run(example_goal, engineer, django_capture_on_commit_callbacks)
    values = ["1", "2", "4", "8", "16", "32"]
    AgentRun.objects.filter(pk=run.pk).update(state={"trials": [
        {"number": n, "params": {"batch_size": v}, "objective": 1.0 + n / 10}
        for n, v in enumerate(values, 1)]})
    run.refresh_from_db()

    run = tuner_step(run, django_capture_on_commit_callbacks)

    assert run.status == AgentRun.Status.FINISHED
    assert "nothing beat the base" in run.stop_reason


def test_the_base_configuration_drawn_by_the_search_spends_none_of_the_experiment_budget(
    example_goal: Goal, engineer: User, django_capture_on_commit_callbacks: Any,
) -> None:
    Boundary.objects.filter(goal=example_goal).update(max_experiments=1)
    run = tuner_run(example_goal, engineer, django_capture_on_commit_callbacks)
    knobs = tuner.turnable(run)
    base = {k.name: knob_read(k, tuner._base_text(run, k)) for k in knobs}
    AgentRun.objects.filter(pk=run.pk).update(state={"trials": [
        {"number": 1, "params": base, "objective": 1.0, "commit": run.base_commit}]})
    run.refresh_from_db()

    run = tuner_step(run, django_capture_on_commit_callbacks)

    # The base's trial ran no experiment: the one experiment the boundary allows is still there.
    experiment = run.experiments.get()
    assert run.waiting_for_id == experiment.pk
    assert run.state["trials"][1]["params"] != base


def test_a_best_configuration_that_misses_a_criterion_is_submitted_saying_which_and_by_how_much(
    example_goal: Goal, engineer: User, django_capture_on_commit_callbacks: Any,
) -> None:
    run = tuner_run(example_goal, engineer, django_capture_on_commit_callbacks)
    params = {"batch_size": "16"}
    commit = tuner._commit_configuration(run, tuner.turnable(run), params)
    miss = "latency-bench.p50_ms vs baseline <= -5.0%: candidate vs baseline -3.43%: misses"
    experiment = ExperimentFactory(
        target=run.target, candidate_commit=commit, baseline_commit=run.base_commit,
        status=Experiment.Status.SUCCEEDED, feedback={"findings": [
            {"layer": "criteria", "kind": "criterion", "severity": severity,
             "title": f"criterion '{name}'", "detail": detail, "specificity": 3,
             "evidence": {"name": name, "verdict": {"criterion": name,
                                                    "passed": severity == "pass",
                                                    "detail": detail}}}
            for severity, name, detail in (("fail", "5% faster", miss),
                                           ("pass", "no slower", "within"))]})
    AgentRun.objects.filter(pk=run.pk).update(state={"stop": True, "trials": [
        {"number": 1, "params": params, "objective": 0.966, "commit": commit,
         "experiment": experiment.pk}]})
    run.refresh_from_db()

    run = tuner_step(run, django_capture_on_commit_callbacks)

    change = run.changes.get()
    assert run.status == AgentRun.Status.SUCCEEDED
    assert run.stop_reason.endswith("; it misses 1 criterion")
    assert f"It misses 1 of {len(run.goal_version.spec['criteria'])} acceptance criteria " \
           f"('5% faster': {miss}): the merge gate holds it." in change.hypothesis
    assert "no slower" not in change.hypothesis


# --- the LLM: dropped replies, progress, submit ----------------------------------------------

def test_a_reply_dropped_by_a_pause_still_counts_its_tokens(
    stub: OpenAIStub, llm_goal: Callable[..., Goal], engineer: User,
    django_capture_on_commit_callbacks: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    goal = llm_goal()
    stub.push(completion(tool_calls=[call("list_files", glob="*")], usage=(700, 30)))
    with django_capture_on_commit_callbacks(execute=False):
        run = run_start(goal=goal, user=engineer)
    real_think = llm_policy.think

    def think_then_pause(prepared: Any) -> Any:
        thought = real_think(prepared)
        run_pause(run=AgentRun.objects.get(pk=prepared.run_id), user=engineer)
        return thought

    monkeypatch.setattr(llm_policy, "think", think_then_pause)
    with django_capture_on_commit_callbacks(execute=False):
        run_step(run_id=run.pk, number=0)

    run.refresh_from_db()
    assert run.status == AgentRun.Status.PAUSED and run.step_count == 0
    assert run.tokens_used == 730
    assert run.events.filter(message__contains="its 730 tokens count").exists()


def fake_experiment(run: AgentRun, findings: list[dict[str, Any]], probes: list[str],
                    status: str = Experiment.Status.SUCCEEDED) -> Experiment:
    experiment = ExperimentFactory.create(
        target=run.target, candidate_commit="a" * 40, baseline_commit=run.base_commit,
        status=status, probes=probes, feedback={"findings": findings})
    run.experiments.add(experiment)
    return experiment


def finding(layer: str, kind: str, severity: str, **evidence: Any) -> dict[str, Any]:
    return {"layer": layer, "kind": kind, "severity": severity, "title": f"{layer} {kind}",
            "detail": "", "evidence": evidence}


def test_a_correctness_fix_is_progress_and_resume_gives_a_fresh_allowance(
    stub: OpenAIStub, llm_goal: Callable[..., Goal], engineer: User,
    django_capture_on_commit_callbacks: Any,
) -> None:
    with django_capture_on_commit_callbacks(execute=False):
        run = run_start(goal=llm_goal(max_experiments=20), user=engineer)
    failing = finding("correctness", "mismatch", "fail", probe="unit", compared="out", case="3")
    for _ in range(5):
        fake_experiment(run, [failing], ["unit"])
    assert llm_policy.stuck(run).startswith("stuck: no progress")

    fake_experiment(run, [], ["unit"])  # the mismatch is gone: a fix, though nothing is faster
    assert llm_policy.stuck(run) == ""

    for _ in range(5):
        fake_experiment(run, [], ["unit"])
    assert llm_policy.stuck(run).startswith("stuck")
    AgentRun.objects.filter(pk=run.pk).update(status=AgentRun.Status.PAUSED)
    with django_capture_on_commit_callbacks(execute=False):
        run = services.run_resume(run=run, user=engineer)
    assert llm_policy.stuck(run) == ""  # a fresh allowance of five
    for _ in range(4):
        fake_experiment(run, [], ["unit"])
    assert llm_policy.stuck(run) == ""
    fake_experiment(run, [], ["unit"])
    assert llm_policy.stuck(run).startswith("stuck")


def test_a_fixed_finding_and_a_criterion_turning_to_pass_are_progress(
    stub: OpenAIStub, llm_goal: Callable[..., Goal], engineer: User,
    django_capture_on_commit_callbacks: Any,
) -> None:
    with django_capture_on_commit_callbacks(execute=False):
        run = run_start(goal=llm_goal(), user=engineer)
    before = fake_experiment(run, [finding("criteria", "criterion", "fail", probe="bench",
                                           name="p99")], ["bench"])
    fixed = fake_experiment(run, [finding("correctness", "fixed", "pass", probe="unit")],
                            ["unit"])
    passing = fake_experiment(run, [finding("criteria", "criterion", "pass", probe="bench",
                                            name="p99")], ["bench"])

    assert llm_policy.progressed(fixed, [before])
    assert llm_policy.progressed(passing, [before])
    assert not llm_policy.progressed(passing, [passing])
    crashed = fake_experiment(run, [], ["bench"], status=Experiment.Status.FAILED)
    assert not llm_policy.progressed(crashed, [before])  # a crash fixes nothing


def test_submit_change_submits_the_worktree_its_experiment_ran(
    stub: OpenAIStub, llm_goal: Callable[..., Goal], engineer: User,
    django_capture_on_commit_callbacks: Any,
) -> None:
    goal = llm_goal()
    stub.push(completion(tool_calls=[call("edit_file", path="config/serving.toml",
                                          old_text="batch_size = 2", new_text="batch_size = 8")]))
    stub.push(completion(tool_calls=[call("run_experiment", reason="batch 8")]))
    with django_capture_on_commit_callbacks(execute=False):
        run = run_start(goal=goal, user=engineer)
        run = step(run)
        run = step(run)
    experiment = run.experiments.get()
    # An edit after the experiment: the evidence no longer matches the worktree.
    stub.push(completion(tool_calls=[call("edit_file", path="config/serving.toml",
                                          old_text="max_queue = 256", new_text="max_queue = 64"),
                                     call("submit_change", title="Batch 8", hypothesis="h",
                                          experiment_id=experiment.pk)]))
    with django_capture_on_commit_callbacks(execute=False):
        run = step(run)
    refused = run.steps.get(number=3).calls[1]
    assert not refused["ok"] and "differs from what experiment" in refused["content"]
    assert not run.changes.exists()

    stub.push(completion(tool_calls=[call("edit_file", path="config/serving.toml",
                                          old_text="max_queue = 64", new_text="max_queue = 256"),
                                     call("submit_change", title="Batch 8", hypothesis="h",
                                          experiment_id=experiment.pk)]))
    with django_capture_on_commit_callbacks(execute=False):
        run = step(run)
    change = run.changes.get()
    assert "+batch_size = 8" in change.diff and "max_queue = 64" not in change.diff
