"""infraops.experiments.behaviour: never-overlapping span pairs and changed spans as findings,
with the idle-time attribution and each side's overlap (issue 10, item 5)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from infraops.experiments.behaviour import behaviour_findings, change_findings, overlap_findings
from infraops.experiments.blobs import blob_put
from infraops.manifest import Probe
from infraops.models import Artifact, Experiment, ProbeExecution, Target
from tests.factories import ExperimentFactory
from tests.infraops.feedback.test_traces import GIL_HELD, GIL_RELEASED, MOONCAKE, complete, trace_of

# The transfer starts only once main's dispatch or combine lets go of the GIL, and takes longer.
KV_WAITS = [
    complete("dispatch", 0, 100), complete("combine", 150, 100),
    complete("kv_transfer", 100, 100, MOONCAKE), complete("kv_transfer", 250, 80, MOONCAKE),
]
KV_OVERLAPS = [
    complete("dispatch", 0, 100), complete("combine", 150, 100),
    complete("kv_transfer", 10, 80, MOONCAKE), complete("kv_transfer", 160, 50, MOONCAKE),
]
EVIDENCE = {"probe": "prefill-kv", "execution": 1, "artifact": "trace.json"}


@pytest.mark.parametrize(("side", "events", "other", "expected"), [
    # The held GIL on the baseline; the released one on the candidate overlaps.
    ("baseline", GIL_HELD, GIL_RELEASED, {
        "kv_transfer never overlaps dispatch": [
            "kv_transfer overlaps dispatch for 0.0% of its time (0 of 150 µs)",
            "overlap 0.0% on the baseline, 62% on the candidate",
            "thread mooncake sat idle for 60% of the time main ran dispatch",
            "kv_transfer sat idle 100 µs a call (300 µs over 3 calls on thread mooncake; "
            "longest 100 µs: 100% dispatch); during 67% of it dispatch ran, 33% combine ran on "
            "thread main"],
        "kv_transfer never overlaps combine": [
            "overlap 0.0% on the baseline, 38% on the candidate",
            "thread mooncake sat idle for 50% of the time main ran combine",
            "during 67% of it dispatch ran, 33% combine ran on thread main"],
    }),
    # Seen from the candidate: the same pair, the other way round.
    ("candidate", GIL_HELD, GIL_RELEASED, {
        "kv_transfer never overlaps dispatch": [
            "overlap 62% on the baseline, 0.0% on the candidate"],
        "kv_transfer never overlaps combine": [
            "overlap 38% on the baseline, 0.0% on the candidate"],
    }),
    # The other side has no transfer at all.
    ("baseline", GIL_HELD, [complete("dispatch", 0, 100)], {
        "kv_transfer never overlaps dispatch": [
            "overlap 0.0% on the baseline, none on the candidate (no kv_transfer spans)"],
        "kv_transfer never overlaps combine": [
            "overlap 0.0% on the baseline, none on the candidate (no kv_transfer spans)"],
    }),
    # No other trace: nothing to compare with, the rest stays.
    ("baseline", GIL_HELD, None, {
        "kv_transfer never overlaps dispatch": ["during 67% of it dispatch ran"],
        "kv_transfer never overlaps combine": ["during 67% of it dispatch ran"],
    }),
    # Released: every pair overlaps, no finding.
    ("candidate", GIL_RELEASED, GIL_HELD, {}),
])
def test_a_pair_that_never_overlaps_names_what_ran_while_its_thread_sat_idle(
    side: str, events: list[dict[str, Any]], other: list[dict[str, Any]] | None,
    expected: dict[str, list[str]],
) -> None:
    found = overlap_findings("prefill-kv", f"default, {side}", trace_of(*events),
                             EVIDENCE | {"side": side}, side=side,
                             other=trace_of(*other) if other is not None else None)
    titles = {f.title.removeprefix(f"prefill-kv [default, {side}] "): f for f in found}
    assert set(titles) == set(expected)
    for title, parts in expected.items():
        finding = titles[title]
        assert (finding.kind, finding.severity) == ("no-overlap", "warn")
        for part in parts:
            assert part in finding.detail
        evidence = json.loads(json.dumps(finding.evidence))  # JSON-ready as stored
        assert evidence["side"] == side and evidence["execution"] == 1
        assert evidence["overlap"]["fraction"] == 0
        attribution = evidence["attribution"]
        assert attribution["name"] == ["kv_transfer"] and attribution["idle_us"] == 300
        assert {(o["name"], o["thread"]) for o in attribution["others"]} == {
            ("dispatch", "main"), ("combine", "main")}
        if other is None:
            assert "overlap_by_side" not in evidence and "on the candidate" not in finding.detail
        else:
            assert list(evidence["overlap_by_side"]) == ["baseline", "candidate"]
            assert evidence["overlap_by_side"][side]["fraction"] == 0


def test_the_pair_overlap_on_each_side_is_in_the_evidence() -> None:
    [_, dispatch] = overlap_findings("p", "default, baseline", trace_of(*GIL_HELD), {},
                                     side="baseline", other=trace_of(*GIL_RELEASED))
    by_side = dispatch.evidence["overlap_by_side"]
    assert by_side["baseline"]["fraction"] == 0
    assert by_side["candidate"]["fraction"] == pytest.approx(80 / 130)
    assert by_side["candidate"]["a"] == ["kv_transfer"] and by_side["candidate"]["b"] == [
        "dispatch"]
    assert (dispatch.evidence["idle_during_us"], dispatch.evidence["held_us"]) == (120, 200)


def test_each_sides_overlap_is_the_median_of_its_repeats_traces() -> None:
    """One trace a loaded machine stalled mid-span (the transfer's span kept open across
    combine: 16% overlap in a fresh-clone run, 2026-12-07) neither hides a pair that never
    overlaps in the other traces nor shows on the side that holds it."""
    stalled = trace_of(*GIL_HELD, complete("kv_transfer", 340, 40, MOONCAKE))
    held, released = trace_of(*GIL_HELD), trace_of(*GIL_RELEASED)
    [alone] = overlap_findings("p", "default, baseline", stalled, {}, side="baseline")
    assert alone.title.endswith("kv_transfer never overlaps combine")  # dispatch: 21%
    repeats = {"baseline": [stalled, held, held], "candidate": [released, released]}
    found = overlap_findings("p", "default, baseline", stalled, {}, side="baseline",
                             other=released, repeats=repeats)
    assert {f.title for f in found} == {"p [default, baseline] kv_transfer never overlaps "
                                        f"{b}" for b in ("dispatch", "combine")}
    for finding in found:
        assert finding.evidence["overlap"]["fraction"] == 0
        assert "overlap 0.0% on the baseline" in finding.detail
        assert "each overlap is the median of 3 baseline traces and 2 candidate traces" in \
            finding.detail
    # A pair that overlaps in most traces is not "never" for one trace where it did not.
    repeats = {"baseline": [held, released, released]}
    assert overlap_findings("p", "default, baseline", held, {}, side="baseline",
                            repeats=repeats) == []


@pytest.mark.parametrize(("baseline", "candidate", "expected"), [
    # The transfer grew because it waited for dispatch, then combine: named, with the pair's
    # overlap before and after.
    (KV_OVERLAPS, KV_WAITS, {
        "span kv_transfer grew": (
            "kv_transfer grew 38% (p50 65.0 µs -> 90.0 µs, total 130 µs -> 180 µs); count 2 -> 2; "
            "on the candidate, kv_transfer sat idle 75 µs a call (150 µs over 2 calls on thread "
            "mooncake; longest 100 µs: 100% dispatch); during 67% of it dispatch ran, 33% "
            "combine ran on thread main; kv_transfer overlapped dispatch 62% on the baseline, "
            "0.0% on the candidate"),
    }),
    # A new wait: all of it is idle time, and it is paired with what held the thread.
    (GIL_RELEASED, [*GIL_RELEASED, complete("gil_wait", 300, 100, MOONCAKE),
                    complete("decode", 250, 200)], {
        "span gil_wait new": (
            "gil_wait is new (1 span, p50 100 µs, total 100 µs); count 0 -> 1; on the "
            "candidate, gil_wait sat idle 190 µs a call (1 call on thread mooncake); during "
            "79% of it decode ran, 21% combine ran on thread main; gil_wait overlapped decode "
            "none on the baseline (no gil_wait spans), 100% on the candidate"),
        # Straight after combine on its thread: it never sat idle, so nothing is worded.
        "span decode new": "decode is new (1 span, p50 200 µs, total 200 µs); count 0 -> 1",
    }),
    # Shrinking spans carry no attribution; a grown one that never sat idle words none.
    (KV_WAITS, [complete("dispatch", 0, 150), complete("combine", 150, 100),
                complete("kv_transfer", 200, 10, MOONCAKE)], {
        "span kv_transfer shrank": (
            "kv_transfer shrank 94% (p50 90.0 µs -> 10.0 µs, total 180 µs -> 10 µs); "
            "count 2 -> 1"),
        "span dispatch grew": (
            "dispatch grew 50% (p50 100 µs -> 150 µs, total 100 µs -> 150 µs); count 1 -> 1"),
    }),
])
def test_a_grown_or_new_span_carries_the_attribution_of_its_idle_time(
    baseline: list[dict[str, Any]], candidate: list[dict[str, Any]],
    expected: dict[str, str],
) -> None:
    found = change_findings("p", "", trace_of(*baseline), trace_of(*candidate), EVIDENCE)
    got = {f.title.removeprefix("p "): f for f in found}
    assert {title: f.detail for title, f in got.items()} == expected
    for finding in got.values():
        evidence = json.loads(json.dumps(finding.evidence))
        assert evidence["span"] == finding.evidence["change"]["name"]
        if finding.kind in ("span-grew", "span-new"):
            assert evidence["attribution"]["name"] == [evidence["span"]]
        else:
            assert "attribution" not in evidence and "overlap_by_side" not in evidence


def test_a_grown_span_with_little_idle_time_keeps_it_in_the_evidence_only() -> None:
    baseline = [complete("dispatch", 0, 1000), complete("kv_transfer", 0, 900, MOONCAKE)]
    candidate = [complete("dispatch", 10, 2000), complete("kv_transfer", 0, 900, MOONCAKE)]
    [grew] = change_findings("p", "", trace_of(*baseline), trace_of(*candidate), {})
    assert grew.detail == ("dispatch grew 100% (p50 1.00 ms -> 2.00 ms, total 1 ms -> 2 ms); "
                           "count 1 -> 1")
    assert grew.evidence["attribution"]["idle_us"] == 10
    assert grew.evidence["attribution"]["others"][0]["name"] == "kv_transfer"
    assert "overlap_by_side" in grew.evidence  # kv_transfer ran 100% of those 10 µs


def _execution(experiment: Experiment, side: str, events: list[dict[str, Any]],
               tmp_path: Path, repeat: int = 0) -> ProbeExecution:
    execution = ProbeExecution.objects.create(
        experiment=experiment, attempt=1, probe="prefill-kv", side=side,
        variant="scenario=prefill_kv", repeat_index=repeat, exit_code=0, reason="ok",
        wall_seconds=1.0)
    source = tmp_path / f"{side}-{repeat}-trace.json"
    source.write_text(json.dumps({"traceEvents": [
        {"name": "thread_name", "ph": "M", "pid": 7, "tid": 1, "args": {"name": "main"}},
        {"name": "thread_name", "ph": "M", "pid": 7, "tid": MOONCAKE,
         "args": {"name": "mooncake"}}, *events]}))
    sha, size = blob_put(Path(settings.DATA_DIR) / "blobs", source)
    Artifact.objects.create(execution=execution, name="trace.json", sha256=sha, size=size)
    return execution


def test_behaviour_findings_read_each_sides_stored_trace(example_target: Target,
                                                         tmp_path: Path) -> None:
    experiment = ExperimentFactory.create(target=example_target, candidate_commit="c" * 40,
                                          baseline_commit="b" * 40, probes=["prefill-kv"])
    base = _execution(experiment, "baseline", GIL_HELD, tmp_path)
    cand = _execution(experiment, "candidate", GIL_RELEASED, tmp_path)
    runs = {(e.probe, e.side, e.variant, 0): e for e in (base, cand)}
    probe = Probe(name="prefill-kv", layer="behaviour", command="true", repeat=1,
                  variants={"scenario": ("prefill_kv",)})
    extras: dict[str, Any] = {"spans": {}}
    found = behaviour_findings(probe, runs, extras)

    never = [f for f in found if f.kind == "no-overlap"]
    assert [f.title for f in never] == [
        "prefill-kv [scenario=prefill_kv, baseline] kv_transfer never overlaps combine",
        "prefill-kv [scenario=prefill_kv, baseline] kv_transfer never overlaps dispatch"]
    assert never[1].evidence["execution"] == base.pk and never[1].evidence["side"] == "baseline"
    assert "overlap 0.0% on the baseline, 62% on the candidate" in never[1].detail
    assert "during 67% of it dispatch ran, 33% combine ran on thread main" in never[1].detail
    gone = [f for f in found if f.kind == "span-gone"]
    assert [f.title for f in gone] == ["prefill-kv [scenario=prefill_kv] span gil_wait gone"]
    assert gone[0].evidence["execution"] == cand.pk
    assert set(extras["spans"]) == {"prefill-kv [scenario=prefill_kv, candidate]",
                                    "prefill-kv [scenario=prefill_kv, baseline]"}
    json.dumps([f.as_dict() for f in found])


@pytest.mark.parametrize(("baseline_totals", "candidate_totals", "kept"), [
    ([100, 100, 100], [300, 310, 290], True),   # grew in every repeat
    ([100, 100, 100], [300, 100, 100], False),  # one stalled call in the first trace only
    ([100], [300], True),                       # one trace a side: nothing to confirm with
])
def test_a_span_change_must_hold_across_the_repeats(baseline_totals: list[int],
                                                    candidate_totals: list[int],
                                                    kept: bool) -> None:
    from infraops.experiments.behaviour import _holds_across_repeats
    from infraops.feedback.findings import Finding

    def traces_of(totals: list[int]) -> list[Any]:
        return [trace_of(complete("normalize", 0, total)) for total in totals]

    grew = Finding("behaviour", "span-grew", "warn", "t", "d", 30, {"span": "normalize"})
    repeats = {"baseline": traces_of(baseline_totals),
               "candidate": traces_of(candidate_totals)}
    assert _holds_across_repeats(grew, repeats) is kept


def test_a_stall_in_the_first_trace_does_not_hide_a_span_that_shrank_in_every_other(
    example_target: Target, tmp_path: Path,
) -> None:
    # The candidate calls normalize a quarter as often (one V tile instead of four), but its
    # first trace stalled in one call: compared alone, that pair shows no change at all.
    experiment = ExperimentFactory.create(target=example_target, candidate_commit="c" * 40,
                                          baseline_commit="b" * 40, probes=["prefill-kv"])
    four = [complete("normalize", 20 * i, 10) for i in range(4)]
    runs = {}
    for repeat in range(3):
        stalled = repeat == 0
        one = [complete("normalize", 0, 45 if stalled else 10)]
        for side, events in (("baseline", four), ("candidate", one)):
            execution = _execution(experiment, side, events, tmp_path, repeat)
            runs[(execution.probe, side, execution.variant, repeat)] = execution
    probe = Probe(name="prefill-kv", layer="behaviour", command="true", repeat=3,
                  variants={"scenario": ("prefill_kv",)})

    found = behaviour_findings(probe, runs, {"spans": {}})

    shrank = [f for f in found if f.kind == "span-shrank"]
    assert [f.title for f in shrank] == ["prefill-kv [scenario=prefill_kv] span normalize shrank"]
    second = runs[("prefill-kv", "candidate", "scenario=prefill_kv", 1)]
    assert shrank[0].evidence["execution"] == second.pk  # told from the pair that shows it


def test_a_grown_span_is_never_paired_with_itself_on_another_thread() -> None:
    # kv_transfer runs on both threads; while main's waits, the other thread's kv_transfer is
    # what ran: no "kv_transfer overlapped kv_transfer".
    baseline = [complete("kv_transfer", 0, 100), complete("kv_transfer", 0, 100, MOONCAKE)]
    candidate = [complete("kv_transfer", 0, 100), complete("kv_transfer", 100, 300, MOONCAKE)]
    found = change_findings("p", "", trace_of(*baseline), trace_of(*candidate), {})
    [grew] = [f for f in found if f.kind == "span-grew"]
    assert "kv_transfer overlapped kv_transfer" not in grew.detail
    assert "overlap_by_side" not in grew.evidence


def test_a_pair_is_told_from_the_thread_that_waited_even_when_its_span_is_the_longer() -> None:
    """On a loaded machine the transfer may take longer in total than dispatch or combine: the
    pair is still told from mooncake's side, the thread that sat idle, not "main sat idle for
    0%" (a fresh-clone run on 2026-12-06 turned it round so)."""
    events = [complete("dispatch", 0, 100), complete("combine", 100, 100),
              complete("schedule", 200, 200), complete("kv_transfer", 200, 200, MOONCAKE)]
    found = overlap_findings("p", "default, baseline", trace_of(*events), {"probe": "p"},
                             side="baseline")
    titles = {f.title.removeprefix("p [default, baseline] "): f.detail for f in found}
    assert set(titles) == {"kv_transfer never overlaps dispatch",
                           "kv_transfer never overlaps combine"}
    assert "thread mooncake sat idle for 100% of the time main ran dispatch" in \
        titles["kv_transfer never overlaps dispatch"]
