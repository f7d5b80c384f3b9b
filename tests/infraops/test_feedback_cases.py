"""The three cases of docs/product.md, end to end through the experiment environment: each small
repository in examples/cases runs sandboxed, and its feedback must name what the report's
engineers needed to see (issue 4, item 7)."""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from infraops import gitops
from infraops.experiments.services import experiment_execute, experiment_request
from infraops.feedback.criteria import evaluate_criterion_ci
from infraops.models import Experiment, Sample, Target
from infraops.services.targets import target_register
from tests.conftest import case_source, make_origin, members_of_new_target

WORKER = "cases:1"


@pytest.fixture
def case_target(db: None, tmp_path: Path) -> Callable[..., Target]:
    def register(name: str, *, repeat: int | None = None) -> Target:
        source = case_source(tmp_path, name)
        if repeat is not None:
            manifest = source / "infraops.toml"
            manifest.write_text(re.sub(r"(?m)^repeat = \d+$", f"repeat = {repeat}",
                                       manifest.read_text()))
        origin = make_origin(tmp_path, source, f"{name}.git")
        return members_of_new_target(
            target_register(name=name, repo_url=str(origin), base_branch="main"))

    return register


def commit_edit(target: Target, tmp_path: Path, path: str, old: str, new: str) -> str:
    tree = tmp_path / f"edit-{target.name}"
    gitops.worktree_add(target.clone_path, tree, target.manifest_commit)
    file = tree / path
    text = file.read_text()
    assert old in text
    file.write_text(text.replace(old, new))
    sha = gitops.commit_all(tree, f"edit {path}", author_name="t", author_email="t@t")
    gitops.worktree_remove(target.clone_path, tree)
    assert sha is not None
    return sha


def run(target: Target, candidate: str, probe: str,
        criteria: list[dict[str, Any]] | None = None) -> Experiment:
    experiment = experiment_request(target=target, candidate_commit=candidate,
                                    baseline_commit=target.manifest_commit, probes=[probe],
                                    criteria=criteria or [])
    result = experiment_execute(experiment_id=experiment.pk, worker=WORKER)
    assert result is not None
    assert result.status == Experiment.Status.SUCCEEDED, result.failure_reason
    return result


def per_execution_medians(experiment: Experiment, probe: str, metric: str, variant: str,
                          side: str) -> list[float]:
    """One value per execution (the median of what it reported), as the analysis uses."""
    by_execution: dict[int, list[float]] = {}
    for execution, value in Sample.objects.filter(
            experiment=experiment, probe=probe, metric=metric, variant=variant,
            side=side).values_list("execution_id", "value"):
        by_execution.setdefault(execution, []).append(value)
    return [statistics.median(values) for values in by_execution.values()]


def findings(experiment: Experiment, **match: str) -> list[dict[str, Any]]:
    return [f for f in experiment.feedback["findings"]
            if all(re.search(v, str(f[k])) for k, v in match.items())]


def test_numerics_names_the_diverging_case_and_the_error_growing_with_length(
    case_target: Callable[[str], Target], tmp_path: Path,
    django_capture_on_commit_callbacks: Any,
) -> None:
    target = case_target("kda-cp-precision")
    fix = commit_edit(target, tmp_path, "kda/merge.py", 'INPUT_PRECISION = "tf32"',
                      'INPUT_PRECISION = "tf32x3"')
    with django_capture_on_commit_callbacks(execute=False):
        experiment = run(target, fix, "cp-equivalence")

    # The base (TF32) diverged: the parallel path against the non-parallel one, at the case
    # with the largest error, its first mismatching index, and an error growing with length.
    # The candidate (tf32x3) no longer does: one "fixed" finding says both.
    [fixed] = findings(experiment, kind="fixed", title=r"\[cp=on\] vs \[cp=off\] fixed")
    assert fixed["severity"] == "pass", experiment.feedback["agent_text"]
    assert re.search(r"worst case len-4096: .* first at \[\d+, \d+, \d+\]", fixed["detail"])
    assert "grows with size" in fixed["detail"]
    assert "at 64 to" in fixed["detail"] and "at 4096" in fixed["detail"]
    assert {"len-64", "len-4096"} <= set(fixed["evidence"]["cases"])
    # The baseline's own failures are not listed as failing; nothing fails on the candidate.
    assert not findings(experiment, severity="fail")
    assert findings(experiment, severity="pass", title=r"\(candidate\)")
    # Candidate against baseline: outputs changed only where the baseline was wrong.
    assert findings(experiment, kind="outputs-fixed", title=r"\[cp=on\]")
    assert experiment.feedback["execution"]["ok"]
    assert experiment.feedback["execution"]["warmups"] == 4
    assert experiment.feedback["findings"][0]["layer"] == "correctness"
    assert len(experiment.feedback["agent_text"]) <= 4000


def test_numerics_on_the_base_names_the_diverging_case_and_what_to_read_first(
    case_target: Callable[[str], Target], django_capture_on_commit_callbacks: Any,
) -> None:
    target = case_target("kda-cp-precision")
    with django_capture_on_commit_callbacks(execute=False):
        experiment = run(target, target.manifest_commit, "cp-equivalence")

    # One cause, one finding (issue 26: it was five, 1.9k characters): every length fails
    # the rule, listed worst first, the worst one's first mismatch, and the error growing
    # with the length that explains them.
    [broken] = findings(experiment, severity="fail")
    assert broken["title"] == ("cp-equivalence [cp=on] vs [cp=off] (candidate) cases "
                               "len-4096, len-1024, len-256, len-64 mismatch"), (
        experiment.feedback["agent_text"])
    assert re.match(r"case len-4096: \d+ of \d+ elements differ; first at \[\d+, \d+, \d+\]",
                    broken["detail"])
    assert re.search(r"grows with size: [\d.]+ at 64 to [\d.]+ at 4096", broken["detail"])
    assert broken["evidence"]["series"]["growing"]
    # The same failure on the baseline is context, not a second failure.
    assert findings(experiment, kind="baseline-failing")
    assert not findings(experiment, severity="fail", title=r"\(baseline\)")
    # Most specific first, and the agent text ends with what to read first.
    assert experiment.feedback["findings"][0]["layer"] == "correctness"
    text = experiment.feedback["agent_text"]
    steps = text[text.index("Next steps:"):]
    assert re.search(r"1\. read case len-4096 of cp-equivalence \[cp=on\] vs \[cp=off\] "
                     r"\(candidate\) first at index \[\d+, \d+, \d+\] \(INFRAOPS_SEED=\d+",
                     steps), steps
    assert "compare variants [cp=on] and [cp=off]" in steps
    assert len(text) <= 4000


def test_concurrency_names_the_spans_that_never_overlap_and_the_criterions_gap(
    case_target: Callable[..., Target], tmp_path: Path,
    django_capture_on_commit_callbacks: Any, client: Any, viewer: Any,
) -> None:
    # Nine executions a side, not the case's five: the suite runs this beside other test
    # processes, and five samples of a wall-time gap measured under that load gave a 95%
    # interval reaching below zero (-6% to +109% around +67%) in one run of the whole suite.
    target = case_target("kv-transfer-gil", repeat=9)
    criterion = {"kind": "relation", "probe": "prefill-kv", "metric": "step_ms",
                 "variant": "scenario=prefill_kv", "reference_variant": "scenario=prefill",
                 "comparison": "<=", "value": 0.05,
                 "description": "step_ms [scenario=prefill_kv] vs [scenario=prefill] <= +5%",
                 "name": "prefill+kv within 5% of prefill"}
    with django_capture_on_commit_callbacks(execute=False):
        base = run(target, target.manifest_commit, "prefill-kv", [criterion])

    never = findings(base, kind="no-overlap", title=r"scenario=prefill_kv.*kv_transfer never "
                                                    r"overlaps (dispatch|combine)")
    assert never, base.feedback["agent_text"]
    assert never[0]["evidence"]["overlap"]["fraction"] < 0.05
    # The blocked-thread evidence: the transfer thread idles while main holds the GIL, and
    # the spans main ran during kv_transfer's idle time are named with their shares.
    detail = never[0]["detail"]
    assert re.search(r"thread mooncake sat idle for (9\d|100)% of the time", detail)
    assert re.search(r"kv_transfer sat idle [\d.]+ [µm]s a call \([^)]*on thread mooncake",
                     detail)
    # The first span named reads "during N% of it <span> ran", the others "N% <span> ran";
    # which span is first depends on the measured shares.
    assert re.search(r"\d+% (?:of it )?dispatch ran", detail)
    assert re.search(r"\d+% (?:of it )?combine ran", detail)
    assert "on thread MainThread" in detail
    main = {o["name"]: o["share"] for o in never[0]["evidence"]["attribution"]["others"]
            if o["thread"] == "MainThread"}
    # Their shares depend on the sandbox's speed (10-20% each here): only that they count.
    assert main["dispatch"] > 0.02 and main["combine"] > 0.02, detail
    assert sum(main.values()) <= 1 + 1e-9
    # Both sides are the same commit: no overlap on either.
    assert re.search(r"overlap \d\.\d% on the baseline, \d\.\d% on the candidate", detail)
    gap = findings(base, layer="criteria")[0]
    assert gap["severity"] == "fail"
    verdict = gap["evidence"]["verdict"]
    # About +50% on an idle machine; a loaded one slows both scenarios and the gap shrinks
    # (+12% was seen with a CI suite beside it), but it stays real and past the bound.
    assert verdict["quantity"] > criterion["value"] and verdict["ci_low"] > 0, verdict
    assert "scenario gap" in gap["detail"] and "95% CI" in gap["detail"]
    # The criterion is called by its name, its condition kept beside it.
    assert gap["title"] == "criterion 'prefill+kv within 5% of prefill' failed"
    assert gap["detail"].startswith("step_ms [scenario=prefill_kv] vs [scenario=prefill]")
    assert "criterion 'prefill+kv within 5% of prefill' failed" in base.feedback["agent_text"]
    client.force_login(viewer)  # the same evidence on the page, for people
    page = client.get(f"/experiments/{base.pk}/").content.decode()
    assert "Spans per thread" in page and "kv_transfer" in page and "never overlaps" in page
    # The trace as a per-thread timeline: the waits for the KV cache (blocked time), and
    # (nearly) no time in which both threads worked.
    line = base.feedback["timelines"]["prefill-kv [scenario=prefill_kv, candidate]"]
    assert {"MainThread", "mooncake"} <= set(line["threads"])
    assert {w[1] for w in line["waits"]} == {"wait_kv"}, line["waits"][:5]
    together = sum(end - start for start, end in line["overlap"])
    assert together < 0.05 * line["duration"], line["overlap"][:10]
    assert 'id="chart-timeline-0"' in page and "Threads worked at the same time for" in page
    # The criteria table: the criterion by name, its condition and its measured gap.
    table = page[page.index('id="criteria"'):]
    assert "prefill+kv within 5% of prefill" in table and "badge failed" in table
    assert "scenario gap" in table

    fix = commit_edit(target, tmp_path, "engine/ep.py", "RELEASE_GIL = False",
                      "RELEASE_GIL = True")
    with django_capture_on_commit_callbacks(execute=False):
        fixed = run(target, fix, "prefill-kv", [criterion])
    after = findings(fixed, layer="criteria")[0]["evidence"]["verdict"]
    # The unfixed code's gap in the same experiment (its baseline side, interleaved with the
    # candidate's executions, so whatever else the machine runs weighs on both alike). On an
    # idle machine the fix takes the gap from about +50% to under +5%; with a CI suite on the
    # other core the two threads share less CPU and both gaps grow (+107% -> +26% was seen),
    # so the fix must at least halve it, and the candidate's threads must overlap (below).
    unfixed = evaluate_criterion_ci(criterion, lambda variant, side: per_execution_medians(
        fixed, "prefill-kv", "step_ms", variant, "baseline"))
    assert unfixed.quantity is not None and after["quantity"] < unfixed.quantity / 2, (
        unfixed.detail, fixed.feedback["agent_text"])
    assert not findings(fixed, kind="no-overlap",
                        title=r"prefill_kv, candidate.*kv_transfer never overlaps dispatch")
    # Before vs after, on the baseline's finding: the fix makes the pair overlap.
    before = findings(fixed, kind="no-overlap",
                      title=r"prefill_kv, baseline.*kv_transfer never overlaps dispatch")
    assert before, fixed.feedback["agent_text"]
    assert before[0]["evidence"]["overlap_by_side"]["candidate"]["fraction"] > 0.1
    assert re.search(r"overlap \d\.\d% on the baseline, [\d.]+% on the candidate",
                     before[0]["detail"])


def test_performance_names_the_repeated_per_tile_work_and_the_speed_up_with_its_interval(
    case_target: Callable[[str], Target], tmp_path: Path,
    django_capture_on_commit_callbacks: Any,
) -> None:
    target = case_target("kda-decode-tiles")
    merged = commit_edit(target, tmp_path, "kernel/tiling.py", "MERGE_TILES = False",
                         "MERGE_TILES = True")
    with django_capture_on_commit_callbacks(execute=False):
        experiment = run(target, merged, "decode-bench")

    speed = findings(experiment, kind="perf-comparison", title="decode_us improved")
    assert speed, experiment.feedback["agent_text"]
    comparison = speed[0]["evidence"]["comparison"]
    assert comparison["ci_high"] < 1.0 and comparison["ratio"] < 0.8
    assert "95% CI" in speed[0]["detail"]
    repeated = findings(experiment, kind="span-shrank", title="span normalize shrank")
    assert repeated, experiment.feedback["agent_text"]
    assert re.search(r"count 80 -> 20", repeated[0]["detail"])


@pytest.mark.django_db(transaction=True)
def test_a_probe_that_asks_for_instructions_gets_callgrind_counts_that_detect_the_change(
    tmp_path: Path,
) -> None:
    # Committed rows: ten runs under callgrind outlast a lease renewal, which happens on the
    # heartbeat thread's own connection and must see the experiment.
    source = case_source(tmp_path, "kda-decode-tiles")
    manifest = source / "infraops.toml"
    text = manifest.read_text().replace("repeat = 6", 'repeat = 5\nmeasure = "instructions"')
    # numpy's import alone costs seconds under callgrind: the demo's count probe runs the
    # kernel's blocks in plain Python.
    manifest.write_text(text.replace("python3 bench/decode_bench.py",
                                     "python3 -S bench/decode_count.py"))
    origin = make_origin(tmp_path, source, "instr.git")
    target = members_of_new_target(
        target_register(name="instr", repo_url=str(origin), base_branch="main"))
    merged = commit_edit(target, tmp_path, "kernel/tiling.py", "MERGE_TILES = False",
                         "MERGE_TILES = True")
    experiment = Experiment.objects.create(  # not experiment_request: nothing is sent
        target=target, candidate_commit=merged, baseline_commit=target.manifest_commit,
        probes=["decode-bench"], changed_paths=["kernel/tiling.py"],
        manifest_sha256=target.manifest_sha256)
    result = experiment_execute(experiment_id=experiment.pk, worker=WORKER)
    assert result is not None and result.status == "succeeded", result and result.failure_reason
    experiment = result

    counts = findings(experiment, kind="perf-comparison", title="instructions improved")
    assert counts, experiment.feedback["agent_text"]
    comparison = counts[0]["evidence"]["comparison"]
    assert comparison["n_baseline"] == comparison["n_candidate"] == 5
    # Instruction counts barely vary: the noise is orders of magnitude below wall time's.
    assert max(comparison["cv_baseline"], comparison["cv_candidate"]) < 0.01
