"""Manifest values that are copied into stored rows fit their columns, checked at parse time:
a value over a column's max_length is a located manifest problem, never an overflow in a
worker (a 250-character variant value used to crash every experiment as 'poison')."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from celery.exceptions import SoftTimeLimitExceeded
from django.contrib.auth.models import User
from django.db import DataError

from agents.models import AgentRun
from infraops import manifest as m
from infraops import tasks
from infraops.errors import DomainError
from infraops.experiments import services as experiments_service
from infraops.experiments.services import experiment_request, queue_for
from infraops.manifest import ManifestError, ManifestProblem, parse_manifest
from infraops.models import (
    AcceptanceCriterion,
    Experiment,
    Goal,
    ProbeExecution,
    Sample,
    Target,
    variant_key,
)
from infraops.services.targets import target_register
from tests.conftest import make_origin
from tests.factories import AgentRunFactory, ExperimentFactory

# Lines 1-5; cases append from line 6 on.
HEAD = """\
[[probe]]
layer = "performance"
command = "python bench.py"
repeat = 1
warmup = 0
"""


def _problems(text: str) -> list[ManifestProblem]:
    with pytest.raises(ManifestError) as caught:
        parse_manifest(text)
    return caught.value.problems


def _only(text: str) -> ManifestProblem:
    problems = _problems(text)
    assert len(problems) == 1, problems
    return problems[0]


def _probe(name: str = "bench", metrics: str = '["ms"]', extra: str = "") -> str:
    return f'{HEAD}name = "{name}"\nmetrics = {metrics}\n{extra}'


def _max_length(model: type, field: str) -> int:
    length = model._meta.get_field(field).max_length
    assert isinstance(length, int)
    return length


# --- the constants are the models' max_length -------------------------------------------


def test_limits_equal_the_model_fields_max_length() -> None:
    for model, field in [(ProbeExecution, "probe"), (Sample, "probe"), (Goal, "probe"),
                         (AcceptanceCriterion, "probe")]:
        assert _max_length(model, field) == m.MAX_PROBE_NAME, f"{model.__name__}.{field}"
    for model, field in [(Sample, "metric"), (Goal, "metric"), (AcceptanceCriterion, "metric")]:
        assert _max_length(model, field) == m.MAX_METRIC_NAME, f"{model.__name__}.{field}"
    for model, field in [(ProbeExecution, "variant"), (Sample, "variant"),
                         (AcceptanceCriterion, "variant"),
                         (AcceptanceCriterion, "reference_variant")]:
        assert _max_length(model, field) == m.MAX_VARIANT_CELL, f"{model.__name__}.{field}"
    assert _max_length(Experiment, "queue") == m.MAX_QUEUE_NAME
    # "probe.metric" of the goal: both names at their longest fit.
    assert _max_length(Experiment, "margin_metric") >= m.MAX_PROBE_NAME + 1 + m.MAX_METRIC_NAME
    # Knob names and compare sides reach no column of their own (JSON); cases and units come
    # from metrics.jsonl and are cut to their columns where they are read.


def test_queue_prefix_is_what_queue_for_writes() -> None:
    probe = parse_manifest(_probe(extra='requires = ["gpu", "big"]\n')).probes[0]
    assert queue_for([probe]) == m._queue_name(["gpu", "big"]) == "experiments.big.gpu"


# --- every over-long value is a named, located problem --------------------------------------


def test_probe_name_over_the_limit() -> None:
    name = "p" * (m.MAX_PROBE_NAME + 1)
    problem = _only(_probe(name=name))
    assert (problem.table, problem.field, problem.line) == (f"probe[1] {name!r}", "name", 6)
    assert f"is {m.MAX_PROBE_NAME + 1} characters" in problem.message
    assert f"at most {m.MAX_PROBE_NAME}" in problem.message
    assert len(str(problem)) < 300  # the value is elided, not printed whole


def test_probe_name_at_the_limit_parses() -> None:
    name = "p" * m.MAX_PROBE_NAME
    assert parse_manifest(_probe(name=name)).probes[0].name == name


def test_metric_name_over_the_limit() -> None:
    metric = "m" * (m.MAX_METRIC_NAME + 1)
    problem = _only(_probe(metrics=f'["ms", "{metric}"]'))
    assert (problem.table, problem.field, problem.line) == ("probe[1] 'bench'", "metrics", 7)
    assert f"metric name '{'m' * 20}..." in problem.message
    assert f"at most {m.MAX_METRIC_NAME}" in problem.message


def test_metric_name_at_the_limit_parses() -> None:
    metric = "m" * m.MAX_METRIC_NAME
    assert parse_manifest(_probe(metrics=f'["{metric}"]')).probes[0].metrics == (metric,)


def test_variant_value_over_the_limit_names_its_key_and_line() -> None:
    value = "x" * 250  # the measured case: it passed validation and crashed every experiment
    problem = _only(_probe(extra=f'variants = {{cp = ["off", "{value}"]}}\n'))
    assert (problem.table, problem.field, problem.line) == ("probe[1] 'bench'", "variants.cp", 8)
    assert "is 250 characters" in problem.message
    assert f"columns of {m.MAX_VARIANT_CELL} characters" in problem.message
    assert "ProbeExecution.variant" in problem.message


def test_variant_value_in_a_sub_table_is_located_on_its_line() -> None:
    value = "x" * 199
    text = _probe(extra=f'[probe.variants]\nbatch = [1, 2]\ncp = ["off", "{value}"]\n')
    problem = _only(text)
    assert (problem.field, problem.line) == ("variants.cp", 10)


def test_variant_cell_over_the_limit_by_its_combination() -> None:
    # Each value fits alone; the longest cell, 'a=<120>,b=<120>', does not.
    text = _probe(extra=f'variants = {{a = ["{"x" * 120}"], b = ["1", "{"y" * 120}"]}}\n')
    problem = _only(text)
    assert (problem.field, problem.line) == ("variants", 8)
    assert "the longest variant cell" in problem.message and "is 245 characters" in problem.message


def test_variant_cell_exactly_at_the_limit_parses_and_fits() -> None:
    # 'a=<97>,b=<98>' is 2 + 97 + 1 + 2 + 98 = 200 characters.
    text = _probe(extra=f'variants = {{a = ["{"x" * 97}"], b = ["{"y" * 98}"]}}\n')
    probe = parse_manifest(text).probes[0]
    cells = [variant_key(cell) for cell in probe.variant_matrix()]
    assert max(map(len, cells)) == m.MAX_VARIANT_CELL


def test_requirements_over_the_queue_name_limit() -> None:
    requirement = "r" * (m.MAX_QUEUE_NAME - len("experiments."))  # exactly fills the name
    fits = _probe(extra=f'requires = ["{requirement}"]\n')
    assert queue_for(parse_manifest(fits).probes) == f"experiments.{requirement}"
    problem = _only(_probe(extra=f'requires = ["{requirement}x"]\n'))
    assert (problem.table, problem.field, problem.line) == ("probe[1] 'bench'", "requires", 8)
    assert "Experiment.queue" in problem.message
    assert f"{m.MAX_QUEUE_NAME + 1} characters" in problem.message


def test_requirements_of_several_probes_together_over_the_queue_name_limit() -> None:
    # An experiment choosing both probes is sent to experiments.<a>.<b>: 11 + 45 + 46 > 100.
    first = _probe(extra=f'requires = ["{"a" * 44}"]\n')
    second = (f'[[probe]]\nname = "other"\nlayer = "performance"\ncommand = "x"\n'
              f'metrics = ["ms"]\nrequires = ["{"b" * 45}"]\n')
    problem = _only(first + second)
    assert (problem.table, problem.field, problem.line) == ("probe[2] 'other'", "requires", 14)


def test_every_problem_is_reported_at_once() -> None:
    text = _probe(name="p" * 101, metrics=f'["{"m" * 101}"]',
                  extra=f'variants = {{cp = ["{"v" * 300}"]}}\n')
    fields = [problem.field for problem in _problems(text)]
    assert fields == ["name", "metrics", "variants.cp"]


def test_the_error_reads_as_one_sentence_per_problem() -> None:
    text = _probe(extra=f'variants = {{cp = ["{"x" * 250}"]}}\n')
    with pytest.raises(ManifestError) as caught:
        parse_manifest(text)
    assert str(caught.value).startswith("line 8, probe[1] 'bench', field variants.cp: ")


# --- end to end: a target, its experiments ----------------------------------------------


def test_a_target_whose_manifest_has_an_over_long_value_lists_the_problem(
    tmp_path: Path, example_source: Path, db: None,
) -> None:
    manifest = example_source / "infraops.toml"
    variants = f'variants = {{cp = ["{"x" * 250}"]}}'
    text = manifest.read_text().replace('metrics = ["latency_ms"]\n',
                                        f'metrics = ["latency_ms"]\n{variants}\n')
    manifest.write_text(text)
    line = text.splitlines().index(variants) + 1
    origin = make_origin(tmp_path, example_source)
    target = target_register(name="long-variant", repo_url=str(origin), base_branch="main")

    assert target.manifest() is None
    assert len(target.manifest_errors) == 1
    assert target.manifest_errors[0].startswith(
        f"line {line}, probe[1] 'latency-bench', field variants.cp: variant value ")
    with pytest.raises(DomainError, match=r"no valid infraops\.toml"):
        experiment_request(target=target, candidate_commit=target.manifest_commit,
                           baseline_commit=target.manifest_commit)


def _waiting_run(experiment: Experiment, goal: Goal, user: User) -> AgentRun:
    return AgentRunFactory.create(
        goal_version=goal.versions.get(), target=experiment.target, policy="tuner",
        status=AgentRun.Status.PAUSED, started_by=user, base_commit=experiment.baseline_commit,
        manifest_sha256=experiment.manifest_sha256, waiting_for=experiment)


def _queued(target: Target) -> Experiment:
    return ExperimentFactory.create(
        target=target, candidate_commit=target.manifest_commit,
        baseline_commit=target.manifest_commit, probes=["latency-bench"],
        manifest_sha256=target.manifest_sha256)


def test_a_failing_sample_write_fails_the_experiment_with_the_reason_and_wakes_the_run(
    example_goal: Goal, engineer: User, monkeypatch: pytest.MonkeyPatch,
    django_capture_on_commit_callbacks: Callable[..., Any],
) -> None:
    def refuse(*args: object, **kwargs: object) -> int:
        raise DataError("value too long for type character varying(200)")

    monkeypatch.setattr(experiments_service, "samples_copy", refuse)
    experiment = _queued(example_goal.target)
    run = _waiting_run(experiment, example_goal, engineer)

    with django_capture_on_commit_callbacks(execute=True):
        result = experiments_service.experiment_execute(experiment_id=experiment.pk,
                                                        worker="test:1")

    assert result is not None
    assert result.status == Experiment.Status.FAILED
    assert result.failure_reason.startswith(
        "unexpected error DataError: value too long for type character varying(200) (at ")
    assert "in refuse)" in result.failure_reason  # where: the innermost frame of our code
    assert result.finished_at is not None and result.lease_expires_at is None
    assert result.summary["attempt"] == 1
    run.refresh_from_db()
    assert run.waiting_for_id is None  # the run waiting for it woke
    assert run.events.filter(message=f"Experiment {experiment.pk} failed.").exists()


def test_a_variant_the_column_refuses_fails_the_experiment_with_the_database_error(
    example_target: Target, monkeypatch: pytest.MonkeyPatch,
    django_capture_on_commit_callbacks: Callable[..., Any],
) -> None:
    # The measured bug, with the parse-time check bypassed: a 203-character cell reaches the
    # ProbeExecution.variant column in the worker.
    monkeypatch.setattr(experiments_service, "variant_key", lambda variant: "cp=" + "x" * 200)
    experiment = _queued(example_target)

    with django_capture_on_commit_callbacks(execute=True):
        result = experiments_service.experiment_execute(experiment_id=experiment.pk,
                                                        worker="test:1")

    assert result is not None
    assert result.status == Experiment.Status.FAILED
    assert result.failure_reason.startswith("unexpected error DataError: ")
    assert "character varying(200)" in result.failure_reason
    assert "(at infraops/experiments/services.py:" in result.failure_reason
    assert "in _record_execution)" in result.failure_reason
    assert not ProbeExecution.objects.filter(experiment=experiment).exists()


def test_a_lost_lease_is_still_not_a_failure(
    example_target: Target, monkeypatch: pytest.MonkeyPatch,
) -> None:
    def lose(*args: object, **kwargs: object) -> None:
        raise experiments_service.LeaseLost("taken over")

    monkeypatch.setattr(experiments_service, "_run_probes", lose)
    experiment = _queued(example_target)

    assert experiments_service.experiment_execute(experiment_id=experiment.pk,
                                                  worker="test:1") is None
    experiment.refresh_from_db()
    assert experiment.status == Experiment.Status.RUNNING and experiment.failure_reason == ""


def test_the_soft_time_limit_is_left_to_the_task(
    example_target: Target, monkeypatch: pytest.MonkeyPatch,
) -> None:
    def too_long(*args: object, **kwargs: object) -> None:
        raise SoftTimeLimitExceeded()

    monkeypatch.setattr(experiments_service, "_run_probes", too_long)
    experiment = _queued(example_target)
    monkeypatch.setattr(experiments_service, "worker_name", lambda: "test:1")

    tasks.experiment_execute(experiment.pk)

    experiment.refresh_from_db()
    assert experiment.status == Experiment.Status.FAILED
    assert experiment.failure_reason.startswith("ran past the task time limit")


def test_unexpected_reason_names_type_message_and_place() -> None:
    empty: dict[str, int] = {}
    try:
        empty["missing"]
    except KeyError as exc:
        reason = experiments_service.unexpected_reason(exc)
    assert reason.startswith("unexpected error KeyError: 'missing' (at tests/infraops/")
    assert "test_manifest_limits.py:" in reason
    assert reason.endswith("in test_unexpected_reason_names_type_message_and_place); the "
                           "worker's log has the traceback")
    long = experiments_service.unexpected_reason(ValueError("y" * 5000))
    assert len(long) < 700 and "(at " not in long  # never raised: no place to name


def test_the_goal_editor_the_manifest_sends_criteria_to_is_the_admins() -> None:
    from django.urls import reverse

    from infraops.manifest import GOAL_EDITOR_PATH

    assert reverse("admin:infraops_goal_changelist") == GOAL_EDITOR_PATH
