"""infraops.feedback.stats on synthetic samples of known effect, and the instruction-count
parsers."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from infraops.feedback import stats
from infraops.feedback.stats import (
    IMPROVED,
    INCONCLUSIVE,
    REGRESSED,
    compare,
    parse_callgrind_total,
    parse_perf_stat_instructions,
)

TRIALS = 200


def lognormal(rng: np.random.Generator, median: float, cv: float, n: int) -> list[float]:
    """Samples with the given median and (approximately) the given coefficient of variation."""
    return rng.lognormal(math.log(median), math.sqrt(math.log1p(cv * cv)), n).tolist()


def verdicts(effect: float, cv: float, n: int, seed: int, trials: int = TRIALS) -> list[str]:
    """Verdicts of `trials` comparisons where the candidate's median is baseline * effect."""
    rng = np.random.default_rng(seed)
    return [
        compare(lognormal(rng, 1.0, cv, n), lognormal(rng, effect, cv, n), seed=t).verdict
        for t in range(trials)
    ]


def test_identical_distributions_are_not_called_a_change_at_20_percent_noise():
    # 1000 trials, not 200: at the expected rate (~0.45%) 200 trials exceed 2 alarms 6% of
    # the time, which would test the seed rather than the rule.
    found = verdicts(1.0, 0.20, 20, seed=1, trials=1000)
    false_alarms = sum(v in (stats.IMPROVED, stats.REGRESSED) for v in found)
    assert false_alarms <= 0.01 * len(found)
    assert found.count(stats.NO_CHANGE) == 0  # a +-1% bound is out of reach at this noise


def test_a_10_percent_slowdown_at_5_percent_noise_is_detected_as_a_regression():
    found = verdicts(1.10, 0.05, 20, seed=2)
    assert found.count(stats.REGRESSED) >= 0.95 * TRIALS
    assert stats.IMPROVED not in found


def test_a_10_percent_speedup_at_5_percent_noise_is_detected_as_an_improvement():
    found = verdicts(1 / 1.10, 0.05, 20, seed=3)
    assert found.count(stats.IMPROVED) >= 0.95 * TRIALS
    assert stats.REGRESSED not in found


def test_maximize_flips_the_verdict():
    rng = np.random.default_rng(4)
    base, cand = lognormal(rng, 100.0, 0.05, 20), lognormal(rng, 120.0, 0.05, 20)
    assert compare(base, cand, direction="minimize").verdict == stats.REGRESSED
    higher_is_better = compare(base, cand, direction="maximize")
    assert higher_is_better.verdict == stats.IMPROVED
    assert higher_is_better.direction == "maximize"
    assert higher_is_better.ratio > 1.1


def test_the_interval_covers_the_true_ratio_about_95_percent_of_the_time():
    rng = np.random.default_rng(5)
    covered = 0
    for t in range(TRIALS):
        result = compare(lognormal(rng, 1.0, 0.2, 20), lognormal(rng, 1.1, 0.2, 20), seed=t)
        covered += result.ci_low <= 1.1 <= result.ci_high
    assert 0.90 <= covered / TRIALS <= 0.99


def test_an_effect_of_the_reported_mde_is_detected_about_80_percent_of_the_time():
    rng = np.random.default_rng(6)
    mde = stats._mde(0.1, 20, 0.1, 20, 0.01)
    found = verdicts(math.exp(mde), 0.1, 20, seed=6)
    half = verdicts(math.exp(mde / 2), 0.1, 20, seed=7)
    assert 0.70 * TRIALS <= found.count(stats.REGRESSED) <= 0.95 * TRIALS
    assert half.count(stats.REGRESSED) <= 0.35 * TRIALS
    observed = compare(lognormal(rng, 1.0, 0.1, 20), lognormal(rng, 1.0, 0.1, 20)).mde
    assert 0.5 * mde < observed < 2 * mde


@pytest.mark.parametrize(
    ("baseline", "candidate"),
    [
        ([], []),
        ([1.0], [2.0, 2.0, 2.0]),
        ([1.0, 1.0, 1.0], [2.0, 2.0]),
        ([1.0, 1.1], [5.0, 5.1]),
    ],
)
def test_fewer_than_three_samples_a_side_is_inconclusive(baseline, candidate):
    result = compare(baseline, candidate)
    assert result.verdict == stats.INCONCLUSIVE
    assert "fewer than 3 samples" in result.reason
    assert (result.n_baseline, result.n_candidate) == (len(baseline), len(candidate))
    json.dumps(result.as_dict(), allow_nan=False)


@pytest.mark.parametrize("value", [0.0, 5.0, 1e9])
def test_constant_equal_samples_are_no_change(value):
    result = compare([value] * 4, [value] * 5)
    assert result.verdict == stats.NO_CHANGE
    assert (result.ratio, result.ci_low, result.ci_high, result.p_value) == (1.0, 1.0, 1.0, 1.0)
    assert result.cv_baseline == result.cv_candidate == result.mde == 0.0


def test_constant_unequal_samples_need_five_a_side_for_the_rank_test():
    # An exact rank test of 3 against 3 can never go below p = 0.1: the verdict waits.
    three = compare([100.0] * 3, [102.0] * 3)
    five = compare([100.0] * 5, [102.0] * 5)
    assert three.verdict == stats.INCONCLUSIVE
    assert "Mann-Whitney" in three.reason
    assert five.verdict == stats.REGRESSED
    assert five.ci_low == five.ci_high == pytest.approx(1.02)


def test_a_real_but_small_effect_under_the_margin_is_no_change():
    rng = np.random.default_rng(8)
    base, cand = lognormal(rng, 1.0, 0.005, 30), lognormal(rng, 1.02, 0.005, 30)
    assert compare(base, cand).verdict == stats.REGRESSED
    bounded = compare(base, cand, margin=0.05)
    assert bounded.verdict == stats.NO_CHANGE
    assert "within +-5.00%" in bounded.reason


def test_wide_noise_with_few_samples_is_inconclusive_and_says_what_it_could_detect():
    rng = np.random.default_rng(9)
    result = compare(lognormal(rng, 1.0, 0.25, 5), lognormal(rng, 1.05, 0.25, 5))
    assert result.verdict == stats.INCONCLUSIVE
    assert result.mde > 0.3
    assert "minimal detectable effect" in result.reason


def test_a_zero_baseline_median_is_inconclusive_not_an_infinite_regression():
    result = compare([0.0, 0.0, 0.0, 1.0], [3.0, 4.0, 5.0, 6.0])
    assert result.verdict == stats.INCONCLUSIVE
    assert result.ratio == math.inf
    assert result.as_dict()["ratio"] is None
    assert "baseline median is 0" in result.reason


def test_the_same_seed_gives_the_same_interval_and_a_json_safe_dict():
    rng = np.random.default_rng(10)
    base, cand = lognormal(rng, 1.0, 0.2, 12), lognormal(rng, 1.0, 0.2, 12)
    first, again = compare(base, cand, seed=3), compare(base, cand, seed=3)
    assert first == again
    payload = json.loads(json.dumps(first.as_dict(), allow_nan=False))
    assert payload["verdict"] in stats.VERDICTS
    assert payload["ci_low"] <= payload["ratio"] <= payload["ci_high"]


@pytest.mark.parametrize(
    ("baseline", "kwargs", "message"),
    [
        ([1.0, math.nan, 1.0], {}, "NaN or infinite"),
        ([1.0, math.inf, 1.0], {}, "NaN or infinite"),
        ([1.0, -1.0, 1.0], {}, "negative"),
        ([[1.0, 2.0], [3.0, 4.0]], {}, "flat sequence"),
        ([1.0, 1.0, 1.0], {"direction": "faster"}, "direction"),
        ([1.0, 1.0, 1.0], {"alpha": 0.0}, "alpha"),
        ([1.0, 1.0, 1.0], {"margin": -0.1}, "margin"),
        ([1.0, 1.0, 1.0], {"margin": math.nan}, "margin"),
        ([1.0, 1.0, 1.0], {"resamples": 10}, "resamples"),
    ],
)
def test_it_rejects_bad_input(baseline, kwargs, message):
    with pytest.raises(ValueError, match=message):
        compare(baseline, [1.0, 1.0, 1.0], **kwargs)


def test_a_nan_in_the_candidate_is_rejected_even_with_too_few_samples():
    with pytest.raises(ValueError, match="candidate"):
        compare([1.0], [math.nan])


CALLGRIND_TWO_EVENTS = """# callgrind format
version: 1
creator: callgrind-3.19.0
pid: 10077
cmd:  ./kernel --case 3
part: 1

positions: line
events: Dr Ir
summary: 28338 128905

fl=(1) ???
fn=(1) 0x0000000000020290
0 3 7
totals: 28338 128903
"""


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
def test_it_reads_the_instruction_total_of_a_real_callgrind_run(tmp_path: Path):
    out = tmp_path / "callgrind.out"
    run = subprocess.run(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "/usr/bin/true"],
        capture_output=True, text=True, timeout=60, check=True,
    )
    collected = int(run.stderr.split("Collected :")[1].split()[0])
    assert parse_callgrind_total(out.read_text()) == collected > 1000


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (CALLGRIND_TWO_EVENTS, 128905),
        (CALLGRIND_TWO_EVENTS.replace("summary: 28338 128905\n", ""), 128903),
        ("events: Ir Dr\nsummary: 42\n", 42),
        ("events: Dr Ir\nsummary: 42\n", 0),  # trailing zero costs may be omitted
    ],
)
def test_it_reads_ir_from_summary_or_totals(text, expected):
    assert parse_callgrind_total(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "events"),
        ("events: Dr Dw\nsummary: 1 2\n", "does not count Ir"),
        ("events: Ir\n", "no 'summary:' or 'totals:'"),
        ("events: Ir\nsummary: 12k\n", "malformed"),
        ("events: Ir\nsummary: -5\n", "malformed"),
        ("events: Ir\nsummary: 5\npart: 2\nsummary: 6\n", "several parts"),
    ],
)
def test_it_rejects_malformed_callgrind_output(text, message):
    with pytest.raises(ValueError, match=message):
        parse_callgrind_total(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1234567,,instructions,1000000,100.00,0.85,insn per cycle\n", 1234567),
        ("# started on Mon\n\n5000,,cycles,1,100.00,,\n77,,instructions:u,1,100.00,,\n", 77),
        (
            "hello from the program\n"
            "<not counted>,,cpu_atom/instructions/,0,0.00,,\n"
            "900,,cpu_core/instructions/,1,100.00,,\n"
            "100,,cpu_core/instructions/u,1,100.00,,\n"
            "3,,branch-instructions,1,100.00,,\n",
            1000,
        ),
    ],
)
def test_it_reads_instructions_from_perf_stat_csv(text, expected):
    assert parse_perf_stat_instructions(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("<not supported>,,instructions,0,100.00,,\n", "cannot count"),
        ("<not counted>,,instructions,0,0.00,,\n", "no counted"),
        ("5000,,cycles,1,100.00,,\n", "no counted"),
        ("1.234.567,,instructions,1,100.00,,\n", "malformed"),
    ],
)
def test_it_rejects_perf_output_without_a_usable_count(text, message):
    with pytest.raises(ValueError, match=message):
        parse_perf_stat_instructions(text)


# --- issue 10: "no change" inside the margin, and inconclusive verdicts that say what decides

@pytest.mark.parametrize(("alpha", "repeats"), [(0.01, 5), (0.05, 4), (0.1, 4), (0.001, 7)])
def test_min_rank_repeats_is_where_complete_separation_first_beats_alpha(alpha, repeats):
    assert stats.min_rank_repeats(alpha) == repeats
    assert 2 / math.comb(2 * repeats, repeats) < alpha <= 2 / math.comb(2 * repeats - 2,
                                                                         repeats - 1)


@pytest.mark.parametrize(("margin", "verdict"), [(0.01, stats.NO_CHANGE), (0.002, stats.REGRESSED)])
def test_a_real_effect_smaller_than_the_margin_is_no_change(margin, verdict):
    # Instruction counts: a real +0.5% (CV 0.01%) is "no change" at a 1% margin, "regressed"
    # at 0.2%.
    rng = np.random.default_rng(10)
    base, cand = lognormal(rng, 1e9, 0.0001, 5), lognormal(rng, 1.005e9, 0.0001, 5)
    result = compare(base, cand, margin=margin)
    assert result.verdict == verdict
    assert result.margin == margin
    if verdict == stats.NO_CHANGE:
        assert "smallest meaningful effect (a real effect, but smaller than that)" in result.reason


@pytest.mark.parametrize(("baseline", "candidate", "goal"), [
    # wall time, ~15% noise, a 10% shift: tens of repeats a side would detect it
    ([1.0, 1.2, 0.8, 1.1, 0.9], [1.1, 1.3, 0.9, 1.2, 1.0], "would detect the observed 10.0%"),
    # instruction counts with a 0.4% shift at 1% noise: how many bound it within +-1%
    ([100.0, 101.0, 99.0, 100.5, 99.5], [100.4, 101.4, 99.4, 100.9, 99.9],
     "would show whether any effect stays within +-1.0%"),
])
def test_an_inconclusive_verdict_says_how_many_repeats_would_decide(baseline, candidate, goal):
    result = compare(baseline, candidate)
    assert result.verdict == stats.INCONCLUSIVE
    assert result.repeats_needed > 5
    assert f"{result.repeats_needed} repeats a side {goal}" in result.advice
    assert result.advice.startswith("with this noise (CV ")
    if "observed" in goal:
        assert result.repeats_needed == stats.repeats_to_detect(
            result.cv_baseline, result.cv_candidate, abs(result.ratio - 1), 0.01)


def test_three_repeats_that_exclude_one_are_told_the_rank_test_needs_five():
    result = compare([100.0, 100.1, 100.2], [103.0, 103.1, 103.2])
    assert result.verdict == stats.INCONCLUSIVE
    assert result.repeats_needed == 5
    assert "cannot reach p < 0.01 with fewer than 5 repeats a side" in result.advice


def test_noise_far_beyond_the_margin_advises_another_instrument():
    result = compare([1.0, 1.3, 0.7, 1.2, 0.8], [1.3, 0.7, 1.0, 0.8, 1.2])
    assert result.verdict == stats.INCONCLUSIVE
    assert result.repeats_needed > stats.MAX_ADVISED_REPEATS
    assert 'measure = "instructions"' in result.advice


def test_decided_verdicts_carry_no_advice():
    result = compare([100.0] * 5, [102.0] * 5)
    assert result.verdict == stats.REGRESSED
    assert (result.repeats_needed, result.advice) == (0, "")


def test_advice_never_asks_for_fewer_repeats_than_already_ran():
    # Most values equal: the robust CV is 0 while the interval is wide.
    result = compare([100.0] * 5 + [90.0, 110.0], [103.0] * 5 + [93.0, 113.0])
    assert result.verdict == stats.INCONCLUSIVE
    assert result.repeats_needed == 14
    assert "the noise estimate is unreliable" in result.advice


def test_values_that_differ_are_not_called_mostly_equal():
    # Every value differs; one outlier a side widens the interval past the robust CV.
    result = compare([100, 100.5, 101, 101.5, 102, 100.2, 160],
                     [103, 103.5, 104, 104.5, 105, 103.2, 40])
    assert result.verdict == stats.INCONCLUSIVE
    assert "the noise estimate is unreliable" in result.advice
    assert "most values equal" not in result.advice
    assert "an outlier widens the interval" in result.advice
    equal = compare([100.0] * 5 + [90.0, 110.0], [103.0] * 5 + [93.0, 113.0])
    assert "most values equal" in equal.advice


# --- the sequential procedure and the first-run guard (issue 26, item 3) ---------------------

LOADED = [1.00, 1.03, 4.10, 0.98, 1.02]  # the third baseline execution hit by load
SLOWER = [3.05, 2.97, 3.02, 3.10, 2.95]


def test_one_loaded_baseline_execution_leaves_five_a_side_inconclusive():
    # What issue 26 saw: a 3x regression, and the loaded execution outranks every candidate.
    assert compare(LOADED, SLOWER).verdict == INCONCLUSIVE


def test_extra_repeats_decide_a_3x_regression_that_one_loaded_execution_hid():
    plan = stats.looks(5, 10)
    rng = np.random.default_rng(7)
    base = LOADED + list(rng.uniform(0.97, 1.03, 10))
    cand = SLOWER + list(rng.uniform(2.9, 3.1, 10))

    first = stats.sequential_compare(base[:5], cand[:5], plan=plan)
    assert first.verdict == INCONCLUSIVE and first.look == 1
    assert stats.more_would_decide(first, plan)  # a large effect, one outlier: worth repeats
    second = stats.sequential_compare(base[:10], cand[:10], plan=plan)
    assert second.verdict == INCONCLUSIVE and second.look == 2  # it still outranks them all
    assert stats.more_would_decide(second, plan)
    done = stats.sequential_compare(base, cand, plan=plan)
    assert done.verdict == REGRESSED
    assert (done.look, done.looks, done.n_baseline) == (3, 3, 15)
    assert done.alpha == pytest.approx(stats.look_levels(3, 0.01)[2])
    assert "look 3 of 3 (15 a side" in done.sequence


def test_the_looks_spend_at_most_alpha_and_the_first_can_still_decide_at_five():
    assert stats.looks(5, 0) == (5,)
    assert stats.looks(5, 10) == (5, 10, 15)
    assert stats.looks(20, 1) == (20, 21)
    assert stats.look_levels(1, 0.01) == (0.01,)
    levels = stats.look_levels(3, 0.01)
    assert sum(levels) == pytest.approx(0.01) and all(level > 0 for level in levels)
    assert levels[0] > 2 / 252  # five a side, completely separated, is p = 2/252
    assert stats.sequential_compare([1.0, 1.01, 0.99, 1.02, 0.98], SLOWER,
                                    plan=(5, 10, 15)).verdict == REGRESSED


def test_the_sequential_procedure_keeps_false_alarms_under_the_level():
    rng = np.random.default_rng(11)
    plan = stats.looks(5, 10)
    alarms = 0
    for trial in range(300):
        base, cand = (list(rng.lognormal(0.0, 0.2, 15)) for _ in range(2))
        result = stats.sequential_compare(base[:5], cand[:5], plan=plan, seed=trial)
        for n in plan[1:]:  # the runner's looks: more only while the data say it may decide
            if not stats.more_would_decide(result, plan):
                break
            result = stats.sequential_compare(base[:n], cand[:n], plan=plan, seed=trial)
        alarms += result.verdict in (IMPROVED, REGRESSED)
    assert alarms <= 3  # 0.01 of 300


def test_a_small_effect_in_wide_noise_is_not_worth_the_extra_repeats():
    rng = np.random.default_rng(3)
    base, cand = list(rng.lognormal(0.0, 0.2, 5)), list(rng.lognormal(0.02, 0.2, 5))
    result = stats.sequential_compare(base, cand, plan=(5, 10, 15))
    assert result.verdict == INCONCLUSIVE
    assert not stats.more_would_decide(result, (5, 10, 15))


def test_a_last_look_or_a_decided_one_asks_for_nothing_more():
    decided = stats.sequential_compare([1.0, 1.01, 0.99, 1.02, 0.98], SLOWER, plan=(5, 10))
    assert not stats.more_would_decide(decided, (5, 10))
    last = stats.sequential_compare(LOADED, SLOWER, plan=(5,))
    assert last.verdict == INCONCLUSIVE and not stats.more_would_decide(last, (5,))


@pytest.mark.parametrize(("values", "direction", "outlier"), [
    # A fresh checkout's first run compiles bytecode: +3.6% instructions, noise 0.03%.
    ([1.036e9, 1.0001e9, 0.9998e9, 1.0002e9, 0.9999e9], "minimize", True),
    ([1.036e9, 1e9, 1e9, 1e9, 1e9], "minimize", True),  # deterministic counts
    # Wall time at 20% noise: a first run 30% slower is noise, not a first-run outlier.
    ([1.3, 1.0, 1.25, 0.8, 1.1], "minimize", False),
    ([0.9, 1.0, 1.001, 0.999, 1.0], "minimize", False),  # better is not a first-run cost
    ([0.9, 1.0, 1.001, 0.999, 1.0], "maximize", True),  # a throughput's first run is lower
    ([1.5, 1.0, 1.0, 1.0], "minimize", True),
    ([1.036e9, 1.0001e9, 0.9998e9], "minimize", True),  # repeat = 3 is guarded too
    ([1.5, 1.0], "minimize", False),  # too few later runs to judge the first
])
def test_a_first_run_outlier_is_worse_than_every_later_run_by_far(values, direction, outlier):
    assert stats.first_run_outlier(values, direction) is outlier


def test_a_first_run_outlier_is_left_out_and_said():
    counts = [1.036e9, 1.0001e9, 0.9998e9, 1.0002e9, 0.9999e9, 1.0000e9]
    slower = [c * 1.015 for c in counts]

    result = stats.sequential_compare(counts, slower, plan=(5,))

    assert result.verdict == REGRESSED  # with the first runs kept, 5 a side cannot decide it
    assert compare(counts[:5], slower[:5]).verdict == INCONCLUSIVE
    assert result.n_baseline == result.n_candidate == 5
    assert result.baseline_median == pytest.approx(1.0e9, rel=1e-3)
    assert result.sequence == ("the baseline and candidate's first execution left out: a "
                               "first-run outlier")
    # Judged on the planned look's values only, so the runner and the analysis agree.
    assert stats.sequential_compare(counts[:5], slower[:5], plan=(5,)).n_baseline == 4
