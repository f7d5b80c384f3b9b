"""The fresh-checkout instruction-count test: real experiments (fresh checkouts, sandboxed runs
under callgrind, warm-ups first) of a pure-Python kernel in a target repository of their own.
A candidate doing 1.5% more instructions is called regressed at repeat = 5, a comment-only
change is called no change, and each side's warm-up ran but gave no sample."""

from __future__ import annotations

import shutil
import statistics

import pytest

from bench import instruction_experiments as ie
from infraops.feedback.stats import NO_CHANGE, REGRESSED
from infraops.models import Sample


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
@pytest.mark.django_db(transaction=True)
def test_fresh_checkout_instruction_counts_detect_1_5_percent_and_call_a_comment_no_change(
) -> None:
    # Committed rows: the lease heartbeat renews on its own connection, and the two
    # experiments run on threads of their own.
    calibration = ie.calibrate()
    more = calibration.iterations_for(ie.PLANTED_RATIO)
    target = ie.make_target("instructions", repeat=5)
    base = target.manifest_commit
    slower = ie.commit_change(target, base, {ie.KERNEL: ie.set_iterations(more)},
                              "1.5% more work")
    comment = ie.commit_change(target, base, {ie.KERNEL: ie.add_comment("A/A")},
                               "a comment")
    regression, same = ie.run_experiments([(target, base, slower), (target, base, comment)])

    planted = ie.instruction_comparison(regression)
    counts = ie.measured_counts(regression)
    ratio = statistics.median(counts["candidate"]) / statistics.median(counts["baseline"])
    assert 1.012 < ratio < 1.018, (ratio, more, calibration)
    assert planted["verdict"] == REGRESSED, regression.feedback["agent_text"]
    assert planted["n_baseline"] == planted["n_candidate"] == 5
    aa = ie.instruction_comparison(same)
    assert aa["verdict"] == NO_CHANGE, same.feedback["agent_text"]
    assert 0.99 < aa["ci_low"] <= aa["ci_high"] < 1.01

    for experiment in (regression, same):
        executions = ie.attempt_executions(experiment)
        warmups = [e for e in executions if e.is_warmup]
        # One warm-up a side, run first on its side, ok, and never a sample.
        assert sorted(e.side for e in warmups) == ["baseline", "candidate"]
        assert all(e.reason == "ok" and e.repeat_index == -1 for e in warmups)
        for side in ("baseline", "candidate"):
            first = min((e for e in executions if e.side == side), key=lambda e: e.pk)
            assert first.is_warmup
        assert not Sample.objects.filter(execution__in=warmups).exists()
        assert Sample.objects.filter(execution__in=executions).count() == 10
        assert experiment.feedback["execution"]["warmups"] == 2
        # Their counts are still readable (from the callgrind artifacts), and a fresh
        # checkout's first run counts more: it compiles the kernel's bytecode.
        measured = ie.measured_counts(experiment)
        for side, values in ie.warmup_counts(experiment).items():
            [warm] = values
            assert warm is not None and warm > statistics.median(measured[side])
