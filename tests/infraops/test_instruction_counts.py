"""The fresh-checkout instruction-count test: real experiments (fresh checkouts, sandboxed runs
under callgrind, no warm-up) of a pure-Python kernel in a target repository of their own.
A candidate doing 1.5% more instructions is called regressed at repeat = 5, a comment-only
change is called no change, and each side's first execution, which pays for the kernel's
bytecode, is left out of the comparison as a first-run outlier and replaced by one more.

They run through bench/feedback_stats.py's own code at its smoke size (one detection and one
A/A experiment, five a side), which then prints its figures from them: the bench's smoke run
leaves these experiments out rather than run them a second time in the suite."""

from __future__ import annotations

import re
import shutil
import statistics

import pytest

from bench import feedback_stats as fs
from bench import instruction_experiments as ie
from infraops.feedback.stats import NO_CHANGE, REGRESSED
from infraops.models import Sample

FIGURE = re.compile(r"^figure: (\S+) (\S+) (\S+)$", re.MULTILINE)


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
@pytest.mark.django_db(transaction=True)
def test_fresh_checkout_instruction_counts_detect_1_5_percent_and_call_a_comment_no_change(
        capsys: pytest.CaptureFixture[str]) -> None:
    # Committed rows: the lease heartbeat renews on its own connection, and the two
    # experiments run on threads of their own.
    assert fs.SMOKE.detect_repeats == range(5, 6) and fs.SMOKE.real_aa_experiments == 1
    real = fs.real_instruction_experiments(fs.SMOKE, keep=True)
    regression, [same] = real.detection[5], real.aa

    planted = ie.instruction_comparison(regression)
    counts = ie.measured_counts(regression)
    ratio = statistics.median(counts["candidate"]) / statistics.median(counts["baseline"])
    assert 1.012 < ratio < 1.018, ratio
    assert planted["verdict"] == REGRESSED, regression.feedback["agent_text"]
    assert planted["n_baseline"] == planted["n_candidate"] == 5
    aa = ie.instruction_comparison(same)
    assert aa["verdict"] == NO_CHANGE, same.feedback["agent_text"]
    assert 0.99 < aa["ci_low"] <= aa["ci_high"] < 1.01

    for experiment in (regression, same):
        executions = ie.attempt_executions(experiment)
        # No warm-up: the first execution of each side ran as a sample, counted more (a fresh
        # checkout's first run compiles the kernel's bytecode), was left out of the
        # comparison, and one more repeat took its place: six a side, five compared.
        assert not any(e.is_warmup for e in executions)
        assert Sample.objects.filter(execution__in=executions).count() == 12
        assert experiment.feedback["execution"]["warmups"] == 0
        comparison = ie.instruction_comparison(experiment)
        assert comparison["n_baseline"] == comparison["n_candidate"] == 5
        assert "first-run outlier" in comparison["sequence"], comparison
        for side, values in ie.measured_counts(experiment).items():
            assert len(values) == 6
            assert values[0] > max(values[1:]), (side, values)
            assert ie.kept_counts(experiment, 5)[side] == values[1:]
        assert min(ie.first_run_excess(experiment).values()) > 1.0  # percent

    # The bench's figures from these experiments: every one printed, well formed, and what
    # the experiments above say.
    capsys.readouterr()
    missed = fs.report_real(real, fs.SMOKE)
    figures = {name: float(value) for name, value, _unit
               in FIGURE.findall(capsys.readouterr().out)}
    assert figures["instructions_detect_1_5pct_runs"] == 5
    assert figures["aa_no_change_rate_real"] == 1.0
    assert figures["instructions_aa_false_alarm_rate_real"] == 0.0
    assert 1.012 < figures["instructions_planted_ratio"] < 1.018  # over the kept counts
    assert {"aa_no_change_rate", "instructions_aa_false_alarm_rate",
            "instructions_warmup_excess"} <= set(figures)
    assert figures["instructions_warmup_excess"] > 1.0
    assert not {"instructions_detect_1_5pct_runs", "instructions_planted_ratio",
                "aa_no_change_rate_real"} & set(missed), missed
