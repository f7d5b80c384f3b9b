"""flash-linear-attention's kernels as they ran on an NVIDIA H200 (tests/infraops/data/fla_h200,
made there by bench/fla_record.py: fla-core 0.6.0, torch 2.11, Triton 3.6, driver 580.159.04),
replayed through the product where there is no GPU. The targets are built as
`manage.py load_example` builds them (from the installed fla-core's own files), each side's
commit has its knob settings, and each sandboxed execution of a probe is stood in for by the
execution recorded at that configuration: everything after it (samples, statistics, criteria,
feedback) is the product's own.

What the feedback must name: for the KDA decode kernel, that fewer warps win (BV 32, 2 warps:
about 12% less time at batch 32 and 64, a goal met with its intervals) and that the merged V
tiles of the published fix (one program per head instead of four) cost registers and win
nothing on this GPU; for the context-parallel merge, that TF32 sits at the 1e-3 bound (its
worst length over it for two seeds of three) and tf32x3 meets it two thousand times over.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from infraops.experiments import accelerators, sandbox
from infraops.experiments import services as experiments
from infraops.experiments.analysis import LookState
from infraops.experiments.services import experiment_execute
from infraops.models import Experiment, Goal, Target
from reviews.gate import ProbeFact
from tests.infraops.experiments.test_gpu_probes import H200_NODES, OUT_NAME, REAL_RUN, end_to_end
from tests.infraops.test_feedback_cases import commit_edit, findings

RECORDED = Path(__file__).parents[1] / "data" / "fla_h200"
RELEASE_KDA = "bv=32-num_warps=4"
REPLAY_EXPERIMENT_ID = 1  # the bootstrap seed of the replayed experiments (see replayed)

pytestmark = pytest.mark.django_db(transaction=True)


def replaying(configurations: dict[str, str]) -> Any:
    """A stand-in for sandbox_run: the recorded execution of the side's configuration
    (`configurations`: side -> the folder bench/fla_record.py named it) at this repeat."""

    def replay(spec: sandbox.SandboxSpec, **kwargs: Any) -> sandbox.SandboxResult:
        found = OUT_NAME.fullmatch(spec.out_dir.name)
        if found is None:
            return REAL_RUN(spec, **kwargs)
        assert list(spec.devices) == H200_NODES and spec.limits.address_space_mb is None, spec
        source = RECORDED / found["probe"] / configurations[found["side"]] / found["repeat"]
        if found["repeat"] == "-1" and not source.exists():
            # The compile cache's fill (compile_cache = true: never a sample) was not
            # recorded: every recorded execution was a fresh process. Its first stands in.
            source = source.with_name("0")
        run = json.loads((source / "run.json").read_text())
        shutil.copy(source / "metrics.jsonl", spec.out_dir / "metrics.jsonl")
        return sandbox.SandboxResult(exit_code=run["exit"], reason="ok",
                                     detail="exit status 0", stdout=b"",
                                     stderr=run["stderr"].encode(), output_truncated=False,
                                     wall_seconds=run["seconds"])

    return replay


def example(name: str) -> tuple[Target, Goal]:
    call_command("load_example", name)
    target = Target.objects.get(name=name)
    return target, Goal.objects.filter(target=target).order_by("pk").first()  # type: ignore[return-value]


def replayed(target: Target, goal: Goal, candidate: str, configurations: dict[str, str],
             monkeypatch: Any) -> Experiment:
    monkeypatch.setattr(experiments.sandbox, "sandbox_run", replaying(configurations))
    # The recordings hold the planned repeats a side and no more: the replay takes no extra
    # look and no repeat in place of a first-run outlier (the analysis still judges them).
    monkeypatch.setattr(experiments, "look_state",
                        lambda *args: LookState(first_run_outlier=False, more_would_decide=False))
    monkeypatch.setattr(accelerators, "gpu_devices", lambda patterns=None: H200_NODES)
    # The experiment's id is the seed of every bootstrap interval of its analysis
    # (infraops/experiments/analysis.py: seed=experiment.pk). Left to the sequence it is one
    # more than the experiments this worker's database made before (flushes keep the
    # sequence), so it varied with test order: batch 1's "within 2%" interval (+0.75%, 5 a
    # side) reaches +2.65% under about 2% of seeds (36, 46, 121, ...). Pinned, the replay is
    # the same in any order; 1 is what a run of this file alone gives.
    experiment = Experiment.objects.create(  # no GPU worker to send it to: run here
        pk=REPLAY_EXPERIMENT_ID,
        target=target, candidate_commit=candidate, baseline_commit=target.manifest_commit,
        probes=[goal.probe], manifest_sha256=target.manifest_sha256, queue="experiments.gpu",
        criteria=[criterion.as_spec() for criterion in goal.criteria.order_by("pk")])
    result = experiment_execute(experiment_id=experiment.pk, worker="replay:1")
    assert result is not None and result.status == Experiment.Status.SUCCEEDED, (
        result and result.failure_reason)
    return result


def comparison(experiment: Experiment, metric: str, case: str = "") -> dict[str, Any]:
    return next(c for c in experiment.summary["comparisons"]
                if c["metric"] == metric and (c.get("case") or "") == case)


def judged(experiment: Experiment, metric: str, case: str = "") -> dict[str, Any]:
    """The performance finding's comparison of a metric (ratio, interval, verdict)."""
    return next(f["evidence"]["comparison"] for f in findings(experiment, kind="perf-comparison")
                if f["evidence"]["metric"] == metric and (f["evidence"].get("case") or "") == case)


def criteria(experiment: Experiment) -> dict[str, bool]:
    return {f["evidence"]["name"]: f["severity"] == "pass"
            for f in findings(experiment, kind="criterion")}


KNOBS = "fla/ops/kda/fused_recurrent.py"


def test_fewer_warps_win_on_the_h200_and_meet_the_goal_with_their_intervals(
        tmp_path: Path, monkeypatch: Any) -> None:
    target, goal = example("fla-kda")
    warps = commit_edit(target, tmp_path, KNOBS, "        num_warps=4,\n",
                        "        num_warps=2,\n")
    experiment = replayed(target, goal, warps,
                          {"baseline": RELEASE_KDA, "candidate": "bv=32-num_warps=2"},
                          monkeypatch)
    text = experiment.feedback["agent_text"]

    # About 12% less time at batch 32 and 64 (15% at 64 sequences of 32 bf16 heads: 90.5 ->
    # 76.3 us), each with an interval that excludes no change.
    for batch in (32, 64):
        found = judged(experiment, f"decode_us_b{batch}")
        assert 0.85 < found["ratio"] < 0.9 and found["ci_high"] < 0.95, found
        assert found["verdict"] == "improved", found
    case = comparison(experiment, "decode_us", "b64-h32-bf16")
    assert 0.8 < case["ratio"] < 0.88, case
    # What the launch costs, case by case: the same four programs per head, fewer warps,
    # more registers per thread (168, from 107), no spills.
    assert comparison(experiment, "num_warps", "b64-h32-bf16")["candidate_median"] == 2
    assert comparison(experiment, "registers", "b64-h32-bf16")["candidate_median"] == 168
    assert comparison(experiment, "programs_per_head", "b64-h32-bf16")["candidate_median"] == 4
    # Every criterion of the goal is met: 5% at 32 and 64, batch 1 and 8 within 2%, and the
    # output within the library's error ratio of float64 (0.0017 in bf16).
    verdicts = criteria(experiment)
    assert len(verdicts) == 5 and all(verdicts.values()), (verdicts, text)
    assert findings(experiment, kind="perf-comparison", title="decode_us_b64 improved"), text
    # The launch facts (registers, warps, programs) are counts: their change is said, never
    # judged a regression of the winning configuration (issue 23: 16 "[FAIL] registers
    # regressed" once led its feedback).
    failing = [f for f in experiment.feedback["findings"] if f["severity"] == "fail"]
    assert failing == [], text


def test_the_merged_v_tiles_cost_registers_and_win_nothing_on_the_h200(
        tmp_path: Path, monkeypatch: Any) -> None:
    target, goal = example("fla-kda")
    merged = commit_edit(target, tmp_path, KNOBS, "    BV = 32\n", "    BV = 128\n")
    experiment = replayed(target, goal, merged,
                          {"baseline": RELEASE_KDA, "candidate": "bv=128-num_warps=4"},
                          monkeypatch)

    # The repeated work is gone (one program per head instead of four) ...
    tiles = comparison(experiment, "programs_per_head", "b64-h32-bf16")
    assert (tiles["baseline_median"], tiles["candidate_median"]) == (4, 1), tiles
    # ... at 253 registers a thread instead of 107, and the time does not follow: at most
    # 1.5% less at batch 64, 21% more at batch 1. The published 9.6% is not this GPU's.
    registers = comparison(experiment, "registers", "b64-h32-bf16")
    assert (registers["baseline_median"], registers["candidate_median"]) == (107, 253)
    assert comparison(experiment, "decode_us_b64")["ratio"] > 0.97
    slower = judged(experiment, "decode_us_b1")
    assert slower["ratio"] > 1.1 and slower["verdict"] == "regressed", slower
    verdicts = criteria(experiment)
    assert not verdicts["batch 32 at least 5% faster"], verdicts
    assert not verdicts["batch 1 no slower (within 2%)"], verdicts
    assert verdicts["equivalent to the float64 recurrence (error ratio <= 0.005, the "
                    "library's test tolerance)"], verdicts


def test_tf32_sits_at_the_merge_bound_and_tf32x3_meets_it_two_thousand_times_over(
        tmp_path: Path, monkeypatch: Any) -> None:
    target, goal = example("fla-cp")
    fixed = commit_edit(target, tmp_path, "fla/ops/cp/chunk_merge.py",
                        "else 'tf32')", "else 'tf32x3')")
    experiment = replayed(target, goal, fixed, {"baseline": "cp_dot_precision=tf32",
                                                "candidate": "cp_dot_precision=tf32x3"},
                          monkeypatch)

    errors = {c["case"]: (c["baseline_median"], c["candidate_median"])
              for c in experiment.summary["comparisons"] if c["metric"] == "rel_error"}
    assert set(errors) == {"len-16", "len-64", "len-256", "len-1024"}, errors
    # TF32: 7.6e-4 to 1.05e-3 at every length (medians of three seeds), at the bound;
    # tf32x3: under 1e-6, about 2,000 times less.
    assert all(5e-4 < base < 2e-3 and fix < 1e-6 for base, fix in errors.values()), errors
    worst = comparison(experiment, "max_rel_error")
    assert worst["baseline_median"] > 1e-3 > 1e-6 > worst["candidate_median"], worst
    # Flat, not growing: with the library's own gate distribution the slowest key channel
    # keeps about half its state across a 64-token chunk, so a merged state forgets within a
    # few chunks and the rounding cannot pile up past them (the figure says so).
    assert comparison(experiment, "slowest_retention")["baseline_median"] == pytest.approx(
        0.464, abs=0.01)
    assert criteria(experiment) == {"max relative error <= 1e-3 at every length": True}
    # The cost of the fix, in the same feedback: the merge takes about 3.5 times as long.
    cost = comparison(experiment, "merge_us", "len-1024")
    assert 3 < cost["ratio"] < 4, cost
    # The manifest raises no plausibility bound: its errors are errors by their names, so the
    # 2,000-fold fall is no integrity finding, and the gate's end-to-end check takes no error
    # metric as a gain (the fix claims none; the slower merge is the feedback check's).
    assert findings(experiment, layer="integrity") == [], experiment.feedback["agent_text"]
    kinds = {f["evidence"]["metric"]: f["evidence"]["kind"]
             for f in findings(experiment, kind="perf-comparison")}
    assert kinds == {"rel_error": "error", "max_rel_error": "error", "merge_us": "time",
                     "slowest_retention": "ratio"}, kinds
    confirmed = end_to_end(experiment, ProbeFact("cp-merge", "performance", 5))
    assert (confirmed.passed, confirmed.detail) == (True, "no performance gain is claimed")
    # The A/B chart: cases in numeric order, the time in its own panel (its unit), apart from
    # the errors.
    merge = [(d["label"], d["unit"]) for d in experiment.feedback["distributions"]
             if d["metric"] == "merge_us"]
    assert merge == [(f"cp-merge merge_us len-{n}", "us") for n in (16, 64, 256, 1024)]
    # The error-versus-length curve of a tuner's configuration, each side's (its errors are
    # metrics with a size label, no outputs to compare): flat, the fix 2,000 times under.
    curves = {s["label"]: dict(map(tuple, s["points"])) for s in experiment.feedback["series"]
              if s["metric"] == "rel_error"}
    assert set(curves) == {"cp-merge baseline", "cp-merge candidate"}, curves
    assert list(curves["cp-merge candidate"]) == [16, 64, 256, 1024]
    assert all(curves["cp-merge candidate"][n] < curves["cp-merge baseline"][n] / 500
               for n in (16, 64, 256, 1024)), curves

