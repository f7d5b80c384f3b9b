"""The flash-linear-attention goals run through the whole product on GPU hosts. First the KDA
decode goal (tests/infraops/data/
fla_gpu_e2e/kda, made by `bench/gpu_device.sh run OUT --fla --fla-target fla-kda
--max-experiments 1 --steer "fla-kda:bv=32 num_warps=2"` on an NVIDIA H100 on 2026-12-06):
`standalone --gpu on`, the tuner steered by a message as an engineer steers it from the run
page, the experiment on the GPU worker's queue, the change in the review queue, the pages read
back as the admin. CI has no GPU: these tests read what that run recorded and hold it to what
the product must have said there.

What the record must show: the steered configuration was tried first and measured on the GPU
queue; the feedback names the four programs a head (the repeated V tiles) and the registers
the fewer warps cost; on the H100 the configuration that wins 12% on the H200 wins 4.7% at
batch 32 and 3.4% at batch 64, short of the goal's 5%, and the gate says so criterion by
criterion while the change waits for a numerics review with its reason.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

import pytest

RECORDED = Path(__file__).parents[1] / "data" / "fla_gpu_e2e" / "kda"


@pytest.fixture(scope="module")
def run() -> dict[str, Any]:
    summary = json.loads((RECORDED / "summary.json").read_text())
    [kda] = summary["runs"]
    assert kda["goal"]["target"] == "fla-kda" and kda["goal"]["policy"] == "tuner"
    return kda


def medians(run: dict[str, Any], metric: str) -> dict[str, tuple[float, float]]:
    """case -> (baseline median, candidate median) of the run's one experiment."""
    [experiment] = run["experiments"]
    return {case: (base, cand) for name, case, _variant, base, cand, _verdict
            in experiment["comparisons"] if name == metric}


def page_text(name: str, folder: Path = RECORDED) -> str:
    raw = (folder / name).read_text()
    raw = re.sub(r"<script.*?</script>", " ", raw, flags=re.S)
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", raw)))


def test_the_steered_configuration_ran_first_on_the_gpu_queue(run: dict[str, Any]) -> None:
    assert run["steered"] == ["bv=32 num_warps=2"]
    [trial] = run["run"]["trials"]
    assert trial["params"] == {"bv": "32", "num_warps": "2"}
    [experiment] = run["experiments"]
    assert experiment["queue"] == "experiments.gpu" and experiment["status"] == "succeeded"
    # Five a side planned; undecided times took the further looks (15 a side).
    assert experiment["executions"] == 30 and experiment["failure"] == ""
    assert run["pages"] == {"dashboard": 200, "run": 200, "queue": 200, "experiment-1": 200,
                            "change": 200}


def test_the_feedback_names_the_repeated_v_tiles_and_what_fewer_warps_cost(
    run: dict[str, Any],
) -> None:
    programs = medians(run, "programs_per_head")
    registers = medians(run, "registers")
    assert len(programs) == 16  # one case per decode shape: batch 1-64, 16 and 32 heads, 2 dtypes
    assert set(programs.values()) == {(4.0, 4.0)}  # BV 32: four V tiles of V = 128 a head
    assert {base for base, _ in registers.values()} <= {106.0, 107.0}
    assert {cand for _, cand in registers.values()} == {168.0}


def test_on_the_h100_fewer_warps_win_less_than_the_goal_asks_and_stay_exact(
    run: dict[str, Any],
) -> None:
    ratio = {metric: cand / base for metric in ("decode_us_b1", "decode_us_b8", "decode_us_b32",
                                                "decode_us_b64")
             for base, cand in [medians(run, metric)[""]]}
    assert ratio["decode_us_b32"] == pytest.approx(0.953, abs=0.002)
    assert ratio["decode_us_b64"] == pytest.approx(0.966, abs=0.002)
    assert ratio["decode_us_b8"] < 0.96 and ratio["decode_us_b1"] < 1.01
    base, cand = medians(run, "max_err_ratio")[""]
    assert base == pytest.approx(cand) and cand < 0.005 / 2


def test_the_change_waits_for_a_numerics_review_and_the_gate_names_each_missed_criterion(
    run: dict[str, Any],
) -> None:
    change = run["change"]
    assert change["status"] == "pending_review" and change["risk_classes"] == ["numerics"]
    assert {r["reason"] for r in change["risk"]} == {
        "the decode kernel's tiling and warps change the order of its FP32 reductions"}
    assert "-        num_warps=4," in change["diff"] and "+        num_warps=2," in change["diff"]

    text = page_text("change.html")
    assert "awaiting review" in text and "3 of 14 checks failing" in text
    assert ("✘ Criterion: batch 32 at least 5% faster kda-decode.decode_us_b32 vs baseline "
            "<= -5.0%: candidate vs baseline -4.72% (95% CI -5.01% to -4.59%): misses") in text
    assert ("✘ Criterion: batch 64 at least 5% faster kda-decode.decode_us_b64 vs baseline "
            "<= -5.0%: candidate vs baseline -3.43%") in text
    assert "✔ Criterion: batch 1 no slower (within 2%)" in text
    assert "✔ Criterion: equivalent to the float64 recurrence" in text


# The fla-cp tuner goal through the whole product on an NVIDIA H200 (2026-12-06,
# `bench/gpu_device.sh run OUT --fla --fla-target fla-cp --max-experiments 1 --remote-workers`):
# the change page and the experiment page as the admin read them (the run's summary did not
# come back from the lent machine: tests/infraops/data/fla_gpu_e2e/cp/README.md).
CP_RECORDED = RECORDED.parent / "cp"


def cp_medians(metric: str) -> dict[str, tuple[float, float]]:
    """case -> (baseline median, candidate median), from the experiment page's comparison
    table ("cp-merge — rel_error len-64 0.001104 ratio 6.261e-07 ratio 0.0005669 3/3")."""
    rows = re.findall(rf"cp-merge — {metric} (\S+) ([\d.e+-]+) \w+ ([\d.e+-]+) \w+ [\d.e+-]+ "
                      r"(\d+)/(\d+)", page_text("tuner-experiment-1.html", CP_RECORDED))
    assert rows, f"no {metric} row on the experiment page"
    return {case: (float(base), float(cand)) for case, base, cand, *_ in rows}


def test_the_cp_tuner_fixed_the_merge_on_the_h200_and_the_change_waits_for_review() -> None:
    text = page_text("tuner-change.html", CP_RECORDED)
    assert "Change 1: Tune cp_dot_precision=tf32x3 awaiting review" in text
    assert ("CP_DOT_PRECISION = tl . constexpr ( 'ieee' if IS_NPU else 'tf32' )" in text
            and "CP_DOT_PRECISION = tl . constexpr ( 'ieee' if IS_NPU else 'tf32x3' )" in text)
    assert ("numerics: the context-parallel merge's precision decides how far long contexts "
            "drift") in text
    assert "Review required : the evidence passes" in text
    assert ("✔ Criterion: max relative error <= 1e-3 at every length cp-merge.max_rel_error <= "
            "0.001: candidate median 7.328e-07 (95% CI 7.328e-07 to 7.328e-07)") in text
    # A precision fix is an error falling, not a speed-up: no gain is claimed, none flagged.
    assert "✔ Gain confirmed end to end no performance gain is claimed" in text
    assert "✔ No integrity flag" in text


def test_the_cp_experiment_measured_the_error_at_every_length_and_what_the_fix_costs() -> None:
    text = page_text("tuner-experiment-1.html", CP_RECORDED)
    assert "Execution: all probes ran: 6 executions, exit 0." in text  # 3 a side, no extra look
    errors = cp_medians("rel_error")
    assert sorted(errors, key=lambda case: int(case.removeprefix("len-"))) == [
        "len-16", "len-64", "len-256", "len-1024"]
    # TF32 sits at the goal's bound (1e-3) at every length; tf32x3 is three orders under it.
    assert all(1.0e-3 < base < 1.5e-3 and cand < 1.0e-6 for base, cand in errors.values())
    [(base, cand)] = cp_medians("max_rel_error").values()
    assert base == pytest.approx(1.377e-3) and cand == pytest.approx(7.328e-7)
    # What the fix costs: the merge at 1024 chunks takes 3.5 times as long.
    times = cp_medians("merge_us")
    assert times["len-1024"][1] / times["len-1024"][0] == pytest.approx(3.48, abs=0.05)


# The fla-cp goal of the scripted LLM demo (`standalone --demo-llm`) through the whole product
# on an NVIDIA H100 (2026-12-06, `PACK=$OUT/cp-llm.tgz bench/gpu_device.sh run /tmp/o --fla
# --fla-target fla-cp --fla-goal "LLM agent"`): summary, the standalone's log (passwords
# removed), the run and change pages.
CP_LLM_RECORDED = RECORDED.parent / "cp-llm"


@pytest.fixture(scope="module")
def llm_run() -> dict[str, Any]:
    summary = json.loads((CP_LLM_RECORDED / "summary.json").read_text())
    [run] = summary["runs"]
    assert run["goal"]["target"] == "fla-cp" and run["goal"]["policy"] == "llm"
    return run


def test_the_llm_agent_measured_the_unchanged_merge_edited_it_and_checked_the_edit_on_the_gpu(
    llm_run: dict[str, Any],
) -> None:
    first, second = llm_run["experiments"]
    for experiment in (first, second):
        assert experiment["queue"] == "experiments.gpu" and experiment["status"] == "succeeded"
        assert experiment["executions"] == 6 and experiment["failure"] == ""  # 3 a side
    # The unchanged code against itself: TF32 misses the bound, flat in the length.
    assert "[FAIL criteria] criterion 'max relative error <= 1e-3 at every length' failed: " \
           "cp-merge.max_rel_error <= 0.001: candidate median 0.001119" in first["feedback"]
    unchanged = first["rel_error_baseline_candidate"]
    assert all(base == cand and 7e-4 < base < 1.2e-3 for base, cand in unchanged.values())
    # tf32x3: three orders of magnitude under the bound at every length.
    fixed = second["rel_error_baseline_candidate"]
    assert len(fixed) == 4 and all(base > 1e-3 and cand < 1e-6 for base, cand in fixed.values())
    assert "Verdict: no failures" in second["feedback"]
    assert llm_run["pages"] == {"dashboard": 200, "run": 200, "queue": 200, "experiment-1": 200,
                                "experiment-2": 200, "change": 200}


def test_the_llm_agent_s_change_waits_for_a_numerics_review(llm_run: dict[str, Any]) -> None:
    assert llm_run["run"]["status"] == "succeeded"
    assert llm_run["run"]["stop_reason"].startswith("submitted change 1: Fixed criterion")
    change = llm_run["change"]
    assert change["status"] == "pending_review" and change["risk_classes"] == ["numerics"]
    assert ("-CP_DOT_PRECISION = tl.constexpr('ieee' if IS_NPU else 'tf32')\n"
            "+CP_DOT_PRECISION = tl.constexpr('ieee' if IS_NPU else 'tf32x3')") in change["diff"]
    text = page_text("run.html", CP_LLM_RECORDED)
    for step in ("list_probes", "run_experiment", "search_code", "read_file", "edit_file",
                 "submit_change"):
        assert f" {step} " in text
    assert "Review required" in page_text("change.html", CP_LLM_RECORDED)


# The fla-cp tuner again, on an NVIDIA H100 with the experiment and GPU workers as another
# host's (`--remote-workers`: a data folder of their own, the web over HTTP), its summary whole
# this time (`PACK=$OUT/cp-tuner.tgz bench/gpu_device.sh run /tmp/o --fla --fla-target fla-cp
# --fla-goal "(tuner)" --max-experiments 1 --remote-workers`, 2026-12-06).
CP_TUNER_H100 = RECORDED.parent / "cp-tuner-h100"


def test_the_cp_tuner_on_a_remote_gpu_worker_fixed_the_merge_at_every_length() -> None:
    summary = json.loads((CP_TUNER_H100 / "summary.json").read_text())
    assert summary["remote_worker_cache"] == ["target-4.git"]  # fetched over HTTP, its own
    [run] = summary["runs"]
    assert run["goal"]["policy"] == "tuner" and run["run"]["stop_reason"] == "submitted change 1"
    [trial] = run["run"]["trials"]
    assert trial["params"] == {"cp_dot_precision": "tf32x3"}
    [experiment] = run["experiments"]
    assert experiment["queue"] == "experiments.gpu" and experiment["executions"] == 6
    errors = experiment["rel_error_baseline_candidate"]
    assert len(errors) == 4 and all(base > 1e-3 and cand < 1e-6
                                    for base, cand in errors.values())
    assert run["change"]["status"] == "pending_review"
    assert run["change"]["risk_classes"] == ["numerics"]
    assert "Review required" in page_text("change.html", CP_TUNER_H100)


# The KDA decode goal again, on an NVIDIA H200 this time, the experiment and GPU workers as
# another host's (2026-12-06, `PACK=$OUT/kda.tgz bench/gpu_device.sh run /tmp/o --fla
# --fla-target fla-kda --max-experiments 1 --steer "fla-kda:bv=32 num_warps=2" --remote-workers
# --deadline 470`): the summary (its samples and findings left out), the standalone's log
# (passwords removed) and the change page. On the H200 the configuration wins the 12% that
# bench/fla_record.py measured there, both 5% criteria pass, and what holds the change is batch
# 1: +1.06% with an interval reaching past the 2% it may lose.
KDA_H200 = RECORDED.parent / "kda-h200"


@pytest.fixture(scope="module")
def h200_summary() -> dict[str, Any]:
    summary: dict[str, Any] = json.loads((KDA_H200 / "summary.json").read_text())
    return summary


@pytest.fixture(scope="module")
def h200_run(h200_summary: dict[str, Any]) -> dict[str, Any]:
    [kda] = h200_summary["runs"]
    assert kda["goal"]["target"] == "fla-kda" and kda["goal"]["policy"] == "tuner"
    assert kda["goal"]["max_experiments"] == 1
    return kda


def test_the_h200_record_comes_from_an_h200(h200_summary: dict[str, Any]) -> None:
    [card] = h200_summary["devices"]
    assert card.startswith("GPU 0: NVIDIA H200 (UUID: GPU-")
    assert "H100" not in json.dumps(h200_summary["devices"])


def test_on_the_h200_the_steered_configuration_ran_first_on_a_remote_gpu_worker(
    h200_summary: dict[str, Any], h200_run: dict[str, Any],
) -> None:
    assert h200_run["steered"] == ["bv=32 num_warps=2"]
    [trial] = h200_run["run"]["trials"]
    assert trial["number"] == 1 and trial["experiment"] == 1
    assert trial["params"] == {"bv": "32", "num_warps": "2"}
    [experiment] = h200_run["experiments"]
    assert experiment["queue"] == "experiments.gpu" and experiment["status"] == "succeeded"
    # Five a side, every execution exit 0: every criterion but batch 1's was settled at the
    # first look, and batch 1's rank test would need 66 a side, past the plan's 15.
    assert experiment["executions"] == 10 and experiment["failure"] == ""
    assert experiment["feedback"].startswith(
        "Execution: all probes ran: 10 executions, exit 0.\n")
    assert 15 < experiment["execution_seconds"] / experiment["executions"] < 21
    # The remote worker fetched the target over HTTP into its own cache, and ran it there.
    assert h200_summary["remote_worker_cache"] == ["target-3.git"]
    log = (KDA_H200 / "standalone.log").read_text()
    assert re.search(r"experiment 1: 2 commit\(s\) fetched into \S+/worker-host/cache/"
                     r"target-3\.git in [\d.]+ s", log)
    assert "password [removed]" in log and not re.search(r"password (?!\[removed\])\S{8,}", log)
    assert h200_run["pages"] == {"dashboard": 200, "run": 200, "queue": 200,
                                 "experiment-1": 200, "change": 200}


def test_on_the_h200_fewer_warps_win_twelve_percent_at_batch_32_and_64(
    h200_run: dict[str, Any],
) -> None:
    median = {metric: medians(h200_run, metric)[""] for metric in (
        "decode_us_b1", "decode_us_b8", "decode_us_b32", "decode_us_b64", "max_err_ratio")}
    assert median["decode_us_b32"] == pytest.approx((152.27, 133.95), abs=0.01)
    assert median["decode_us_b64"] == pytest.approx((269.92, 237.10), abs=0.01)
    ratio = {metric: cand / base for metric, (base, cand) in median.items()}
    assert ratio["decode_us_b32"] == pytest.approx(0.880, abs=0.002)  # bench record: 0.876
    assert ratio["decode_us_b64"] == pytest.approx(0.878, abs=0.002)  # bench record: 0.883
    assert ratio["decode_us_b8"] == pytest.approx(0.924, abs=0.002)   # bench record: 0.926
    assert 1.0 < ratio["decode_us_b1"] < 1.02                          # bench record: 1.008
    assert median["max_err_ratio"][0] == pytest.approx(median["max_err_ratio"][1])
    assert median["max_err_ratio"][1] < 0.005 / 2
    assert h200_run["run"]["trials"][0]["objective"] == pytest.approx(ratio["decode_us_b64"])


def test_on_the_h200_the_gate_passes_both_5_percent_criteria_and_holds_batch_1(
    h200_run: dict[str, Any],
) -> None:
    assert h200_run["run"]["status"] == "succeeded"
    assert h200_run["run"]["stop_reason"] == "submitted change 1; it misses 1 criteria"
    change = h200_run["change"]
    assert change["status"] == "pending_review" and change["risk_classes"] == ["numerics"]
    assert {r["reason"] for r in change["risk"]} == {
        "the decode kernel's tiling and warps change the order of its FP32 reductions"}
    assert "-        num_warps=4," in change["diff"] and "+        num_warps=2," in change["diff"]

    text = page_text("change.html", KDA_H200)
    assert "Change 1: Tune bv=32, num_warps=2 awaiting review" in text
    assert "2 of 14 checks failing , and a reviewer decides on 2 more" in text
    assert ("✔ Criterion: batch 32 at least 5% faster kda-decode.decode_us_b32 vs baseline "
            "<= -5.0%: candidate vs baseline -12.03% (95% CI -12.45% to -11.64%): within "
            "<= -0.05 with 95% confidence") in text
    assert ("✔ Criterion: batch 64 at least 5% faster kda-decode.decode_us_b64 vs baseline "
            "<= -5.0%: candidate vs baseline -12.16% (95% CI -12.31% to -11.88%): within "
            "<= -0.05 with 95% confidence") in text
    assert ("✔ Criterion: batch 8 no slower (within 2%) kda-decode.decode_us_b8 vs baseline "
            "<= +2.0%: candidate vs baseline -7.63% (95% CI -9.00% to -5.60%)") in text
    assert ("✘ Criterion: batch 1 no slower (within 2%) kda-decode.decode_us_b1 vs baseline "
            "<= +2.0%: candidate vs baseline +1.06% (95% CI -2.18% to +2.95%): the point "
            "estimate meets <= 0.02 but the interval does not, so it is not established") in text
    assert "✔ Criterion: equivalent to the float64 recurrence" in text
    assert ("✘ No failing finding 1 failing in experiment 1: criterion 'batch 1 no slower "
            "(within 2%)' failed") in text
    assert ("numerics: 2 findings (first fla/ops/kda/fused_recurrent.py:330: the decode "
            "kernel's tiling and warps change the order of its FP32 reductions)") in text
    assert "It misses 1 of 5 acceptance criteria ('batch 1 no slower (within 2%)'" in text


# The fla-cp goal of the scripted LLM demo on an NVIDIA H200 (2026-12-06, `PACK=$OUT/cp-llm.tgz
# bench/gpu_device.sh run /tmp/o --fla --fla-target fla-cp --fla-goal "LLM agent" --deadline
# 450`): the summary, the standalone's log (passwords removed) and the run page. The deadline
# came first: the H200 took longer an execution than the H100 (Triton compiles and autotunes
# in every fresh process), and the summary was taken while the edit's experiment was on its
# last execution, so the run was still running and no change had been submitted.
CP_LLM_H200 = RECORDED.parent / "cp-llm-h200"


@pytest.fixture(scope="module")
def llm_h200_summary() -> dict[str, Any]:
    summary: dict[str, Any] = json.loads((CP_LLM_H200 / "summary.json").read_text())
    [card] = summary["devices"]
    assert card.startswith("GPU 0: NVIDIA H200 (UUID: GPU-")
    return summary


def test_on_the_h200_the_llm_agent_measured_the_unchanged_merge_and_edited_it(
    llm_h200_summary: dict[str, Any],
) -> None:
    [run] = llm_h200_summary["runs"]
    assert run["goal"]["target"] == "fla-cp" and run["goal"]["policy"] == "llm"
    first, _ = run["experiments"]
    assert first["queue"] == "experiments.gpu" and first["status"] == "succeeded"
    assert first["executions"] == 6 and first["failure"] == ""  # 3 a side
    assert "Execution: all probes ran: 6 executions, exit 0." in first["feedback"]
    assert "[FAIL criteria] criterion 'max relative error <= 1e-3 at every length' failed: " \
           "cp-merge.max_rel_error <= 0.001: candidate median 0.001168" in first["feedback"]
    # The unchanged code against itself: identical on both sides; on this seed TF32 stays
    # under the bound up to 256 chunks and passes it at 1024.
    unchanged = first["rel_error_baseline_candidate"]
    assert all(base == cand for base, cand in unchanged.values())
    assert {case: round(base, 5) for case, (base, _) in unchanged.items()} == {
        "default len-16": 0.00056, "default len-64": 0.00065, "default len-256": 0.00047,
        "default len-1024": 0.00117}
    text = page_text("run.html", CP_LLM_H200)
    for step in ("list_probes", "run_experiment", "search_code", "read_file", "edit_file"):
        assert f" {step} " in text
    assert ("edit_file path=fla/ops/cp/chunk_merge.py new_text=CP_DOT_PRECISION = "
            "tl.constexpr('ieee' if IS_NPU else 'tf32x3')") in text
    assert llm_h200_summary["runs"][0]["pages"] == {
        "dashboard": 200, "run": 200, "queue": 200, "experiment-1": 200, "experiment-2": 200}


def test_on_the_h200_the_deadline_came_before_the_edit_s_experiment_ended(
    llm_h200_summary: dict[str, Any],
) -> None:
    [run] = llm_h200_summary["runs"]
    assert run["run"]["status"] == "running" and run["run"]["stop_reason"] == ""
    assert run["change"] is None and "submit_change" not in page_text("run.html", CP_LLM_H200)
    _, second = run["experiments"]
    assert second["queue"] == "experiments.gpu" and second["status"] == "running"
    assert second["executions"] == 5 and second["rel_error_baseline_candidate"] == {}
    # 29-35 s a TF32 execution and 57-62 s a tf32x3 one on the H200 (its first record), about
    # 42 s on average here: the six executions did not fit the 450 s.
    assert 35 < second["execution_seconds"] / second["executions"] < 50
    assert ["fla_cp_llm_gpu_experiments_succeeded_on_the_gpu_queue", 1, "count"] in (
        llm_h200_summary["figures"])
    # The experiment's task ended less than a second after the summary was taken.
    log = (CP_LLM_H200 / "standalone.log").read_text()
    assert re.search(r"20:45:09,\d+: INFO/ForkPoolWorker-\d\] Task "
                     r"infraops\.tasks\.experiment_execute\[[0-9a-f-]+\] succeeded in 264\.\d+s",
                     log)
    assert "password [removed]" in log and not re.search(r"password (?!\[removed\])\S{8,}", log)


# The same goal of the scripted LLM demo with the probe's compile cache (compile_cache = true),
# on an H100 (2026-12-07; an H200 was asked for and not to be had).
CP_LLM_CACHE = RECORDED.parent / "cp-llm-h100-cache"


@pytest.fixture(scope="module")
def llm_cache_run() -> dict[str, Any]:
    summary: dict[str, Any] = json.loads((CP_LLM_CACHE / "summary.json").read_text())
    [card] = summary["devices"]
    assert card.startswith("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-")
    [run] = summary["runs"]
    return run


def test_with_a_compile_cache_each_side_compiles_once_and_its_samples_read_it(
    llm_cache_run: dict[str, Any],
) -> None:
    for experiment in llm_cache_run["experiments"]:
        assert experiment["status"] == "succeeded" and experiment["queue"] == "experiments.gpu"
        times = experiment["execution_times"]
        # Each side's fill first (never a sample), then three samples a side, ABBA.
        assert [(side, repeat) for side, repeat, _ in times] == [
            ("baseline", -1), ("candidate", -1), ("baseline", 0), ("candidate", 0),
            ("candidate", 1), ("baseline", 1), ("baseline", 2), ("candidate", 2)]
        for side in ("baseline", "candidate"):
            fill = next(s for name, repeat, s in times if name == side and repeat == -1)
            samples = [s for name, repeat, s in times if name == side and repeat >= 0]
            # 38-64 s compiling the merge's 16 autotuned configurations; 14-21 s with them
            # compiled (torch's start, the autotuner timing them again, the float64 reference).
            assert max(samples) < 0.6 * fill, (side, fill, samples)
    first, second = llm_cache_run["experiments"]
    # The kernels a cache holds are the ones a fresh process compiles: the merge at 1024
    # chunks took 1.79 ms (tf32) and 6.20 ms (tf32x3), 3.46x, as in the run without a cache on
    # an H100 (1.80 and 6.23 ms, 3.46x).
    merge = {c[1]: (c[3], c[4]) for c in second["comparisons"] if c[0] == "merge_us"}
    assert 1700 < merge["len-1024"][0] < 1900 and 3.3 < merge["len-1024"][1] / merge[
        "len-1024"][0] < 3.6
    assert all(base == cand for base, cand in first["rel_error_baseline_candidate"].values())
    assert max(c for _, c in second["rel_error_baseline_candidate"].values()) < 1e-6


def test_with_a_compile_cache_the_llm_agent_s_change_waits_for_a_numerics_review(
    llm_cache_run: dict[str, Any],
) -> None:
    assert llm_cache_run["run"]["status"] == "succeeded"
    assert llm_cache_run["run"]["stop_reason"].startswith("submitted change 1: Fixed criterion "
                                                          "'max relative error <= 1e-3")
    change = llm_cache_run["change"]
    assert (change["status"], change["risk_classes"]) == ("pending_review", ["numerics"])
    assert "'tf32x3')" in change["diff"] and "Review required" in page_text(
        "change.html", CP_LLM_CACHE)
    assert set(llm_cache_run["pages"].values()) == {200}
    log = (CP_LLM_CACHE / "standalone.log").read_text()
    assert "password [removed]" in log and not re.search(r"password (?!\[removed\])\S{8,}", log)
