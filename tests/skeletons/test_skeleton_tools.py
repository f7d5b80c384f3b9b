"""The skeleton tools (skeletons/tools.py), called as the model calls them, through
tool_call: a target whose probes declare what they exercise in `meta`, a run on it with
experiments whose feedback measured a bottleneck, and the seeded library."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from agents.models import AgentRun, RunEvent
from agents.policies.shared import boundary
from agents.tools import REGISTRY, ToolContext, ToolResult, tool_call
from infraops.models import Experiment, Goal, Target
from infraops.services.targets import target_register
from skeletons.models import Skeleton, SkeletonUse
from tests.conftest import make_origin, members_of_new_target
from tests.factories import (
    AgentRunFactory,
    ChangeFactory,
    ExperimentFactory,
    GoalFactory,
    TargetFactory,
)

MANIFEST = """
[[probe]]
name = "cp-check"
layer = "correctness"
command = "true"
covers = ["kda/**"]
meta = {op_class = "merge", dtype = "fp32", seq_len = [1024, 65536]}

[[probe]]
name = "prefill-kv"
layer = "behaviour"
command = "true"
metrics = ["step_ms"]
covers = ["engine/**"]

[[probe]]
name = "decode-bench"
layer = "performance"
command = "true"
metrics = ["decode_us"]
covers = ["kernel/**"]
meta = {op_class = "decode", dtype = "fp32", bottleneck = "compute"}
"""


@pytest.fixture
def kernels(db: None, skeleton_seeds: None, tmp_path: Path) -> Target:
    source = tmp_path / "kernels-src"
    (source / "kda").mkdir(parents=True)
    (source / "infraops.toml").write_text(MANIFEST)
    (source / "kda" / "merge.py").write_text("INPUT_PRECISION = 'tf32'\n")
    return members_of_new_target(target_register(
        name="kernels", repo_url=str(make_origin(tmp_path, source, "kernels.git")),
        base_branch="main"))


@pytest.fixture
def run(kernels: Target, engineer: User) -> AgentRun:
    goal = GoalFactory.create(target=kernels, name="exact merge", probe="cp-check",
                              metric="wall_ms", policy=Goal.Policy.LLM, owner=engineer,
                              boundary__editable_paths="kda/**", snapshot_by=engineer)
    # Policy ("llm"), base commit and manifest hash: the goal's and the kernels target's.
    return AgentRunFactory.create(goal=goal, started_by=engineer)


@pytest.fixture
def ctx(run: AgentRun, tmp_path: Path) -> ToolContext:
    return ToolContext(worktree=tmp_path, policy=boundary(run), base_commit=run.base_commit,
                       run=run)


def measured(run: AgentRun, *findings: dict[str, Any], status: str = "succeeded") -> Experiment:
    """One of the run's experiments, finished with these findings (as analysis stores them)."""
    experiment = ExperimentFactory.create(
        target=run.target, status=status, candidate_commit="b" * 40,
        baseline_commit=run.base_commit, finished_at=timezone.now(),
        feedback={"findings": list(findings)})
    run.experiments.add(experiment)
    return experiment


def growing_error(probe: str) -> dict[str, Any]:
    return {"layer": "correctness", "kind": "error-vs-size", "severity": "fail",
            "title": f"{probe} [cp=on] vs [cp=off] (candidate) error versus size",
            "detail": "slope 0.42", "evidence": {"probe": probe, "series": {"growing": True}}}


def threads_apart(probe: str) -> dict[str, Any]:
    return {"layer": "behaviour", "kind": "no-overlap", "severity": "warn",
            "title": f"{probe} [scenario=prefill_kv] dispatch never overlaps kv_transfer",
            "detail": "0.0%", "evidence": {"probe": probe}}


def call(ctx: ToolContext, name: str, **arguments: Any) -> ToolResult:
    return tool_call(ctx, name, json.dumps(arguments))


def error_of(result: ToolResult) -> dict[str, Any]:
    assert not result.ok, result.content
    payload: dict[str, Any] = json.loads(result.content)
    assert {"error", "tool", "hint"} <= set(payload)
    return payload


def slugs(result: ToolResult) -> list[str]:
    assert result.ok, result.content
    return [found["slug"] for found in result.data["skeletons"]]


# --------------------------------------------------------------------------- registry


def test_the_tools_are_registered_as_run_tools_offered_to_the_model() -> None:
    search, apply = REGISTRY["skeleton_search"], REGISTRY["skeleton_apply"]

    assert search.needs_run and search.untrusted
    assert apply.needs_run and apply.parameters["required"] == ["skeleton", "note"]
    from agents.tools import tool_specs

    names = [spec["function"]["name"] for spec in tool_specs()]
    assert {"skeleton_search", "skeleton_apply"} <= set(names)


def test_without_a_run_they_answer_a_structured_error(tmp_path: Path, ctx: ToolContext) -> None:
    bare = ToolContext(worktree=tmp_path, policy=ctx.policy, base_commit=ctx.base_commit)

    for name, arguments in (("skeleton_search", {}),
                            ("skeleton_apply", {"skeleton": "fuse-per-tile-work", "note": "x"})):
        assert "needs a run" in error_of(call(bare, name, **arguments))["error"]


# --------------------------------------------------------------------------- skeleton_search


def test_a_measured_precision_bottleneck_on_a_merge_probe_finds_the_tf32x3_merge(
        ctx: ToolContext, run: AgentRun) -> None:
    experiment = measured(run, growing_error("cp-check"))

    result = call(ctx, "skeleton_search")

    assert slugs(result) == ["higher-precision-merge"]  # the GIL's and the tiles' ruled out
    [found] = result.data["skeletons"]
    assert found["unknown"] == []
    assert found["met"] == ["op_class is one of merge, scan, matmul",
                            "dtype is one of fp32, tf32", "bottleneck is precision"]
    assert f"bottleneck=precision (experiment {experiment.pk}: cp-check" in result.content
    assert "tf32x3" in result.content
    assert "Record: not applied yet; from KDA context-parallel merge, FLA" in result.content


def test_with_nothing_measured_the_bottleneck_is_unknown_and_said_so(ctx: ToolContext) -> None:
    result = call(ctx, "skeleton_search")

    assert slugs(result) == ["higher-precision-merge"]
    assert result.data["skeletons"][0]["unknown"] == ["bottleneck is precision"]
    assert "Unknown (check these yourself): bottleneck is precision (no bottleneck is known " \
           "for this probe)" in result.content
    assert "Measured: none yet." in result.content


def test_threads_that_never_overlap_find_the_gil_release(ctx: ToolContext,
                                                         run: AgentRun) -> None:
    measured(run, threads_apart("prefill-kv"), growing_error("cp-check"))

    result = call(ctx, "skeleton_search", probe="prefill-kv")

    assert slugs(result) == ["release-gil-around-native-waits"]
    assert result.content.startswith("Probe prefill-kv: layer=behaviour. Measured: "
                                     "bottleneck=serialized-threads (experiment")
    assert result.data["facts"][0]["value"] == "serialized-threads"
    assert "gil_scoped_release" in result.content


def test_a_declared_compute_bottleneck_finds_the_tile_fusion(ctx: ToolContext) -> None:
    result = call(ctx, "skeleton_search", probe="decode-bench")

    assert slugs(result) == ["fuse-per-tile-work"]
    assert result.data["skeletons"][0]["unknown"] == []


def test_drafts_are_left_out_unless_asked_and_never_another_targets(
        ctx: ToolContext, run: AgentRun, engineer: User) -> None:
    other = TargetFactory.create(name="other")
    foreign = ChangeFactory.create(target=other, title="t", diff="--- a/x\n+++ b/x\n",
                                   author_label="run 9")
    condition = [{"field": "layer", "op": "eq", "value": "correctness"}]
    for slug, source in (("own-draft", None), ("foreign-draft", foreign)):
        Skeleton.objects.create(slug=slug, name=slug, summary="s", transformation="t",
                                provenance="p", applicability=condition, proposed_from=source)

    assert "own-draft" not in slugs(call(ctx, "skeleton_search"))
    with_drafts = slugs(call(ctx, "skeleton_search", include_drafts=True))
    assert "own-draft" in with_drafts and "foreign-draft" not in with_drafts
    refused = error_of(call(ctx, "skeleton_apply", skeleton="foreign-draft", note="try"))
    assert refused["error"] == "no skeleton 'foreign-draft' in the library"


def test_words_narrow_the_search(ctx: ToolContext) -> None:
    assert slugs(call(ctx, "skeleton_search", query="tf32x3")) == ["higher-precision-merge"]
    nothing = call(ctx, "skeleton_search", query="no such words anywhere")
    assert nothing.ok and slugs(nothing) == []
    assert "No skeleton fits" in nothing.content


def test_an_unknown_probe_is_an_error_naming_the_probes(ctx: ToolContext) -> None:
    payload = error_of(call(ctx, "skeleton_search", probe="no-such-probe"))

    assert payload["error"] == "no probe 'no-such-probe' in the run's manifest"
    assert payload["hint"] == "Its probes: cp-check, prefill-kv, decode-bench."


@pytest.mark.parametrize(("name", "arguments", "field"), [
    ("skeleton_search", '{"include_drafts": "yes"}', "include_drafts"),
    ("skeleton_search", '{"probe": ""}', "probe"),
    ("skeleton_search", json.dumps({"query": "x" * 201}), "query"),
    ("skeleton_search", '{"tag": "gpu"}', "tag"),
    ("skeleton_apply", '{"skeleton": "fuse-per-tile-work"}', "note"),
    ("skeleton_apply", '{"skeleton": 7, "note": "x"}', "skeleton"),
    ("skeleton_apply", "not json", ""),
], ids=["boolean-as-text", "empty-probe", "long-query", "unknown-field", "no-note",
        "slug-as-number", "not-json"])
def test_malformed_arguments_get_a_clear_error_and_record_nothing(
        ctx: ToolContext, name: str, arguments: str, field: str) -> None:
    result = tool_call(ctx, name, arguments)

    payload = error_of(result)
    assert payload.get("field", "") == field
    assert payload["tool"] == name
    assert not SkeletonUse.objects.exists()


# --------------------------------------------------------------------------- skeleton_apply


def test_applying_a_skeleton_records_one_open_use_for_the_run(ctx: ToolContext,
                                                              run: AgentRun) -> None:
    first = call(ctx, "skeleton_apply", skeleton="higher-precision-merge",
                 note="kda/merge.py: the state merge's dot")
    again = call(ctx, "skeleton_apply", skeleton="higher-precision-merge",
                 note="kda/merge.py: both merge dots")

    assert first.ok and again.ok
    assert "was already recorded; its note is updated" in again.content
    [use] = SkeletonUse.objects.filter(run=run)
    assert (use.skeleton.slug, use.outcome, use.change) == (
        "higher-precision-merge", SkeletonUse.Outcome.APPLIED, None)
    assert use.note == "kda/merge.py: both merge dots"
    assert RunEvent.objects.filter(run=run, data__skeleton="higher-precision-merge").count() == 2


def test_a_settled_use_leaves_room_for_a_new_one(ctx: ToolContext, run: AgentRun) -> None:
    call(ctx, "skeleton_apply", skeleton="fuse-per-tile-work", note="first try")
    SkeletonUse.objects.filter(run=run).update(outcome=SkeletonUse.Outcome.REJECTED)

    result = call(ctx, "skeleton_apply", skeleton="fuse-per-tile-work", note="second try")

    assert result.ok and "recorded" in result.content
    assert sorted(SkeletonUse.objects.filter(run=run).values_list("outcome", flat=True)) == [
        "applied", "rejected"]


def test_an_unknown_skeleton_is_an_error_naming_the_library(ctx: ToolContext) -> None:
    payload = error_of(call(ctx, "skeleton_apply", skeleton="make-it-fast", note="x"))

    assert payload["error"] == "no skeleton 'make-it-fast' in the library"
    assert "higher-precision-merge" in payload["hint"]
    assert not SkeletonUse.objects.exists()
