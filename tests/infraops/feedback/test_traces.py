"""infraops.feedback.traces: Chrome traces into span statistics, overlap, blocking, idle gaps, idle
attribution and diffs."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infraops.feedback.traces import (
    MAX_PROBLEMS,
    Span,
    Trace,
    TraceError,
    blocked_intervals,
    idle_attribution,
    idle_intervals,
    overlap,
    parse_trace,
    span_stats,
    timeline,
    trace_diff,
)

MAIN, MOONCAKE = 1, 2


def complete(name: str, ts: float, dur: float, tid: int = MAIN, pid: int = 7,
             cat: str = "") -> dict[str, Any]:
    return {"name": name, "cat": cat, "ph": "X", "ts": ts, "dur": dur, "pid": pid, "tid": tid}


def mark(ph: str, ts: float, name: str = "", tid: int = MAIN) -> dict[str, Any]:
    return {"name": name, "ph": ph, "ts": ts, "pid": 7, "tid": tid}


def thread_name(tid: int, name: str, pid: int = 7) -> dict[str, Any]:
    return {"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}}


def trace_of(*events: dict[str, Any], names: bool = True) -> Trace:
    meta = [thread_name(MAIN, "main"), thread_name(MOONCAKE, "mooncake")] if names else []
    return parse_trace(json.dumps({"traceEvents": [*meta, *events]}))


# dispatch/combine alternate on main; the transfer thread only runs in the gaps, after waiting
# for the GIL the whole time a C++ call holds it (DeepEP v1.2.1, case 2 of docs/product.md).
GIL_HELD = [
    complete("dispatch", 0, 100), complete("combine", 150, 100),
    complete("dispatch", 300, 100), complete("combine", 450, 100),
    complete("gil_wait", 20, 80, MOONCAKE), complete("kv_transfer", 100, 50, MOONCAKE),
    complete("gil_wait", 150, 100, MOONCAKE), complete("kv_transfer", 250, 50, MOONCAKE),
    complete("kv_transfer", 400, 50, MOONCAKE),
]
# After the fix the transfer runs while dispatch/combine wait on the GPU.
GIL_RELEASED = [
    complete("dispatch", 0, 100), complete("combine", 150, 100),
    complete("kv_transfer", 10, 80, MOONCAKE), complete("kv_transfer", 160, 50, MOONCAKE),
]


# --- parsing -------------------------------------------------------------------------------


def test_it_reads_the_object_and_the_bare_array_forms_alike() -> None:
    events = [thread_name(MAIN, "main"), complete("dispatch", 5, 10)]
    as_object = parse_trace(json.dumps({"traceEvents": events, "displayTimeUnit": "ns"}))
    as_array = parse_trace(json.dumps(events).encode())
    expected = (Span("dispatch", "", 7, MAIN, 5.0, 15.0),)
    assert as_object.spans == as_array.spans == expected
    assert as_object.thread_label((7, MAIN)) == "main"
    assert as_object.problems == ()


def test_it_pairs_nested_begin_and_end_events_per_thread_in_time_order() -> None:
    trace = trace_of(
        mark("E", 100, tid=MAIN), mark("B", 0, "outer"), mark("B", 10, "inner"),  # file order
        mark("B", 20, "other", tid=MOONCAKE), mark("E", 30, tid=MAIN),
        mark("E", 40, "other", tid=MOONCAKE),
    )
    got = {(s.name, s.tid, s.start_us, s.end_us) for s in trace.spans}
    assert got == {("outer", MAIN, 0, 100), ("inner", MAIN, 10, 30),
                   ("other", MOONCAKE, 20, 40)}
    assert trace.problems == ()


@pytest.mark.parametrize(("events", "spans", "problem"), [
    ([mark("B", 0, "a"), mark("E", 5), mark("E", 9)],
     [("a", 0, 5)], "event 4 (E '') on main at ts 9 has no open B"),
    ([mark("B", 0, "a"), mark("E", 5, "b")],
     [("a", 0, 5)], "event 3 (E 'b') on main closes B 'a' (event 2)"),
    ([mark("B", 0, "a"), mark("B", 1, "b"), mark("E", 2)],
     [("b", 1, 2)], "event 2 (B 'a') on main never ended"),
    ([{"name": "a", "ph": "X", "ts": 3, "tid": MAIN, "pid": 7}],
     [], "event 2 (X 'a') has no dur"),
    ([{"name": "thread_name", "ph": "M", "pid": 7, "tid": 3, "args": {}}],
     [], "event 2 (M 'thread_name') has no args.name"),
])
def test_mismatched_events_become_problems_not_exceptions(
    events: list[dict[str, Any]], spans: list[tuple[str, float, float]], problem: str,
) -> None:
    trace = trace_of(*events)
    assert [(s.name, s.start_us, s.end_us) for s in trace.spans] == spans
    assert len(trace.problems) == 1
    assert trace.problems[0].startswith(problem)


def test_it_caps_the_problems_and_counts_the_rest() -> None:
    trace = trace_of(*[mark("E", t) for t in range(MAX_PROBLEMS + 7)])
    assert len(trace.problems) == MAX_PROBLEMS + 1
    assert trace.problems[-1] == "... and 7 more problems"


def test_it_keeps_instants_as_zero_length_spans_and_counts_ignored_phases() -> None:
    trace = trace_of(
        {"name": "step", "ph": "i", "ts": 40, "pid": 7, "tid": MAIN, "s": "t"},
        {"name": "flush", "ph": "I", "ts": 50, "pid": 7, "tid": MAIN},
        {"name": "queue", "ph": "C", "ts": 1, "pid": 7, "args": {"depth": 3}},
        {"name": "queue", "ph": "C", "ts": 2, "pid": 7, "args": {"depth": 4}},
        {"name": "flow", "ph": "s", "ts": 3, "pid": 7, "tid": MAIN, "id": 1},
        {"name": "thread_sort_index", "ph": "M", "pid": 7, "tid": MAIN, "args": {}},
    )
    assert [(s.name, s.start_us, s.dur_us) for s in trace.spans] == [("step", 40, 0),
                                                                     ("flush", 50, 0)]
    assert dict(trace.ignored) == {"C": 2, "s": 1, "M": 1}
    assert trace.as_dict()["ignored"] == {"C": 2, "s": 1, "M": 1}


def test_thread_labels_name_the_process_when_the_trace_has_several() -> None:
    trace = parse_trace(json.dumps([
        {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "prefill"}},
        thread_name(MOONCAKE, "mooncake", pid=1),
        complete("kv_transfer", 0, 5, MOONCAKE, pid=1), complete("decode", 0, 5, 9, pid=2),
    ]))
    assert trace.thread_label((1, MOONCAKE)) == "prefill/mooncake"
    assert trace.thread_label((2, 9)) == "pid 2/tid 9"
    assert [t["name"] for t in trace.as_dict()["threads"]] == ["prefill/mooncake", "pid 2/tid 9"]


def test_it_reads_an_array_whose_closing_bracket_is_missing() -> None:
    text = json.dumps([complete("dispatch", 0, 10), complete("combine", 10, 5)])[:-1] + ",\n"
    trace = parse_trace(text)
    assert [s.name for s in trace.spans] == ["dispatch", "combine"]
    assert trace.problems == ("the events array has no closing ']'",)


THREE_MILLION_EVENTS = b"[" + b"0," * 2_999_999 + b"0]"


@pytest.mark.parametrize(("data", "message"), [
    (b"not json", "the trace is not valid JSON: Expecting value: line 1 column 1"),
    (b"\x80\x81[", "the trace is not UTF-8 JSON"),
    ("{}", "the trace object has no traceEvents list"),
    ('{"traceEvents": {"ph": "X"}}', "traceEvents is an object, not a list of events"),
    ('"trace"', "a trace is a JSON object with a traceEvents list or a JSON array of events, "
                "not a string"),
    ("[5]", "event 0 is a number, not an object"),
    ('[{"ts": 1, "name": "a"}]', "event 0 has no phase (ph)"),
    ('[{"ph": "X", "name": "dispatch", "dur": 3}]', "event 0 (X 'dispatch') has no ts"),
    ('[{"ph": "B", "name": "a", "ts": "12"}]', "event 0 (B 'a') ts is a string, not a number"),
    ('[{"ph": "X", "name": "a", "ts": NaN, "dur": 1}]', "event 0 (X 'a') ts is not a finite"),
    ('[{"ph": "X", "name": "a", "ts": 0, "dur": -2.5}]',
     "event 0 (X 'a') has a negative dur (-2.5)"),
    ('[{"ph": "X", "name": 3, "ts": 0, "dur": 1}]', "event 0 name is a number, not a string"),
    ('[{"ph": "X", "name": "a", "ts": 0, "dur": 1, "tid": [1]}]',
     "event 0 (X 'a') tid is an array, not an integer or string"),
    (THREE_MILLION_EVENTS, "the trace has 3000000 events, more than the cap of 2000000"),
    (b'{"traceEvents": ' + THREE_MILLION_EVENTS + b"}",
     "the trace has 3000000 events, more than the cap of 2000000"),
    ("[" * 100_000 + "]" * 100_000, "the trace is nested too deeply"),
])
def test_malformed_traces_raise_trace_error_with_the_reason(data: bytes | str,
                                                           message: str) -> None:
    with pytest.raises(TraceError) as caught:
        parse_trace(data)
    assert str(caught.value).startswith(message)
    assert isinstance(caught.value, ValueError)


def test_the_event_cap_can_be_lowered() -> None:
    events = json.dumps([complete("a", t, 1) for t in range(11)])
    assert len(parse_trace(events, max_events=11).spans) == 11
    with pytest.raises(TraceError, match="11 events, more than the cap of 10"):
        parse_trace(events, max_events=10)


JSON_SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner,
                                                                max_size=4),
    max_leaves=12,
)
EVENT_LIKE = st.dictionaries(
    st.sampled_from(["name", "cat", "ph", "ts", "dur", "pid", "tid", "args", "s"]),
    st.sampled_from(["X", "B", "E", "i", "I", "M", "C", "thread_name", "process_name"])
    | st.fixed_dictionaries({"name": JSON_SCALARS}) | JSON_VALUES,
    max_size=9,
)
TRACE_LIKE = (
    st.lists(EVENT_LIKE, max_size=8)
    | st.fixed_dictionaries({"traceEvents": st.lists(EVENT_LIKE, max_size=8) | JSON_VALUES})
    | JSON_VALUES
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(document=TRACE_LIKE, truncate=st.integers(min_value=0, max_value=3))
def test_parse_trace_raises_nothing_but_trace_error(document: Any, truncate: int) -> None:
    text = json.dumps(document)
    try:
        trace = parse_trace(text[: len(text) - truncate] if truncate else text)
    except TraceError:
        return
    assert all(s.end_us >= s.start_us for s in trace.spans)
    json.dumps(trace.as_dict())


@settings(max_examples=100, deadline=None)
@given(data=st.binary(max_size=40) | st.text(max_size=40))
def test_parse_trace_rejects_arbitrary_bytes_only_with_trace_error(data: bytes | str) -> None:
    try:
        trace = parse_trace(data)
    except TraceError as exc:
        assert str(exc)
        return
    assert isinstance(trace, Trace)


# --- statistics ----------------------------------------------------------------------------


@pytest.mark.parametrize(("durations", "count", "total", "p50", "p95", "maximum"), [
    ([10.0 * k for k in range(1, 21)], 20, 2100, 105, 190.5, 200),
    ([7.0], 1, 7, 7, 7, 7),
    ([1.0, 2.0, 3.0, 4.0, 100.0], 5, 110, 3, 80.8, 100),
    ([0.0, 0.0], 2, 0, 0, 0, 0),
])
def test_span_stats_are_exact_on_constructed_spans(
    durations: list[float], count: int, total: float, p50: float, p95: float, maximum: float,
) -> None:
    starts = [1000.0 * i for i in range(len(durations))]
    trace = trace_of(*[complete("dispatch", t, d) for t, d in zip(starts, durations, strict=True)])
    [stats] = span_stats(trace)
    assert (stats.name, stats.thread, stats.pid, stats.tid) == ("dispatch", "main", 7, MAIN)
    assert (stats.count, stats.total_us, stats.max_us) == (count, total, maximum)
    assert stats.p50_us == pytest.approx(p50)
    assert stats.p95_us == pytest.approx(p95)


def test_span_stats_split_by_thread_and_sort_by_total() -> None:
    trace = trace_of(
        complete("kv_transfer", 0, 5, MOONCAKE), complete("kv_transfer", 10, 5, MAIN),
        complete("dispatch", 0, 50), complete("kv_transfer", 20, 30, MOONCAKE),
    )
    got = [(s.name, s.thread, s.count, s.total_us) for s in span_stats(trace)]
    assert got == [("dispatch", "main", 1, 50), ("kv_transfer", "mooncake", 2, 35),
                   ("kv_transfer", "main", 1, 5)]
    assert span_stats(trace)[0].as_dict()["p95_us"] == 50


# --- overlap -------------------------------------------------------------------------------


@pytest.mark.parametrize(("events", "a", "b", "overlapped", "total", "detail"), [
    (GIL_HELD, "kv_transfer", ["dispatch", "combine"], 0, 150,
     "kv_transfer overlaps dispatch|combine for 0.0% of its time (0 of 150 µs)"),
    (GIL_RELEASED, "kv_transfer", "dispatch", 80, 130,
     "kv_transfer overlaps dispatch for 61.5% of its time (80 µs of 130 µs)"),
    (GIL_RELEASED, "kv_transfer", ["dispatch", "combine"], 130, 130,
     "kv_transfer overlaps dispatch|combine for 100.0% of its time (130 µs of 130 µs)"),
    ([complete("kv_transfer", 0, 4000, MOONCAKE), complete("dispatch", 3000, 5000)],
     "kv_transfer", "dispatch", 1000, 4000,
     "kv_transfer overlaps dispatch for 25.0% of its time (1 ms of 4 ms)"),
    # Nested and concurrent spans count once on each side.
    ([complete("kv_transfer", 0, 100, MOONCAKE), complete("kv_transfer", 20, 30, MOONCAKE),
      complete("kv_transfer", 50, 100, 3), complete("dispatch", 0, 75),
      complete("dispatch", 50, 25, 4)],
     "kv_transfer", "dispatch", 75, 150,
     "kv_transfer overlaps dispatch for 50.0% of its time (75 µs of 150 µs)"),
    (GIL_HELD, "kv_*", "[dc]*", 0, 150,
     "kv_* overlaps [dc]* for 0.0% of its time (0 of 150 µs)"),
    (GIL_HELD, ["gil_wait", "kv_transfer"], "dispatch", 80, 330,
     "gil_wait|kv_transfer overlaps dispatch for 24.2% of its time (80 µs of 330 µs)"),
])
def test_overlap_measures_how_much_of_a_is_covered_by_b(
    events: list[dict[str, Any]], a: str | list[str], b: str | list[str], overlapped: float,
    total: float, detail: str,
) -> None:
    result = overlap(trace_of(*events), a, b)
    assert (result.overlapped_us, result.total_a_us) == (overlapped, total)
    assert result.fraction == pytest.approx(overlapped / total)
    assert result.detail == detail
    assert result.as_dict()["detail"] == detail


def test_overlap_says_when_the_first_set_is_missing_or_has_no_time() -> None:
    trace = trace_of(*GIL_HELD, {"name": "tick", "ph": "i", "ts": 5, "pid": 7, "tid": MAIN})
    assert overlap(trace, "kv_send", "dispatch").detail == "no kv_send spans in the trace"
    ticks = overlap(trace, "tick", "dispatch")
    assert (ticks.fraction, ticks.detail) == (None, "tick spans take no time (instants only)")
    with pytest.raises(ValueError, match="at least one name"):
        overlap(trace, [], "dispatch")


def test_exact_names_match_even_when_they_look_like_globs() -> None:
    trace = trace_of(complete("copy[0]", 0, 10), complete("copy0", 20, 10),
                     complete("dispatch", 0, 100, MOONCAKE))
    assert overlap(trace, "copy[0]", "dispatch").total_a_us == 20  # itself and the glob match
    assert overlap(trace, "copy[1]", "dispatch").a_spans == 0


# --- blocking and idleness -----------------------------------------------------------------


def test_a_gil_wait_on_the_transfer_thread_is_blocked_by_dispatch_on_main() -> None:
    [first, second] = blocked_intervals(trace_of(*GIL_HELD), waiting="gil_wait*",
                                        holding=["dispatch", "combine"])
    assert (first.thread, first.start_us, first.end_us, first.dur_us) == ("mooncake", 20, 100, 80)
    assert (first.waiting, first.holders, first.holding) == (("gil_wait",), ("main",),
                                                             ("dispatch",))
    assert (second.start_us, second.dur_us, second.holding) == (150, 100, ("combine",))
    assert first.detail == "mooncake waited (gil_wait) for 80 µs at +20 µs while main held dispatch"
    assert second.as_dict()["dur_us"] == 100


@pytest.mark.parametrize(("events", "min_us", "expected"), [
    # No wait spans once the GIL is released.
    (GIL_RELEASED, 0, []),
    # The holding span on the waiting thread itself does not block it.
    ([complete("gil_wait", 0, 50, MOONCAKE), complete("dispatch", 0, 50, MOONCAKE)], 0, []),
    # Two holders back to back make one interval naming both.
    ([complete("gil_wait", 0, 100, MOONCAKE), complete("dispatch", 10, 40),
      complete("combine", 50, 30, 3)], 0,
     [(10, 80, ("main", "tid 3"), ("combine", "dispatch"))]),
    # A gap in the holding splits it; min_us drops the short piece.
    ([complete("gil_wait", 0, 100, MOONCAKE), complete("dispatch", 0, 20),
      complete("dispatch", 30, 60)], 0,
     [(0, 20, ("main",), ("dispatch",)), (30, 90, ("main",), ("dispatch",))]),
    ([complete("gil_wait", 0, 100, MOONCAKE), complete("dispatch", 0, 20),
      complete("dispatch", 30, 60)], 25, [(30, 90, ("main",), ("dispatch",))]),
])
def test_blocked_intervals_cover_only_waiting_while_another_thread_holds(
    events: list[dict[str, Any]], min_us: float,
    expected: list[tuple[float, float, tuple[str, ...], tuple[str, ...]]],
) -> None:
    got = blocked_intervals(trace_of(*events), waiting="gil_wait", holding=["dispatch", "combine"],
                            min_us=min_us)
    assert [(i.start_us, i.end_us, i.holders, i.holding) for i in got] == expected


@pytest.mark.parametrize(("thread", "within", "min_us", "expected"), [
    ("main", None, 0, [(100, 150), (250, 300), (400, 450)]),
    (MAIN, None, 60, []),
    ((7, MAIN), (50, 320), 0, [(100, 150), (250, 300)]),
    ("mooncake", None, 0, [(0, 20), (300, 400), (450, 550)]),
    ("mooncake", (0, 600), 60, [(300, 400), (450, 600)]),
    (MOONCAKE, (120, 310), 0, [(300, 310)]),
])
def test_idle_intervals_are_the_gaps_in_a_threads_activity(
    thread: Any, within: tuple[float, float] | None, min_us: float,
    expected: list[tuple[float, float]],
) -> None:
    trace = trace_of(*GIL_HELD)
    got = idle_intervals(trace, thread, within=within, min_us=min_us)
    assert [(i.start_us, i.end_us) for i in got] == expected
    assert {i.kind for i in got} <= {"idle"}


def test_idle_intervals_refuse_a_thread_the_trace_does_not_have() -> None:
    trace = trace_of(*GIL_HELD)
    with pytest.raises(ValueError, match="'decode' names no thread of the trace"):
        idle_intervals(trace, "decode")
    detail = idle_intervals(trace, "mooncake", min_us=60)[0].detail
    assert detail == "mooncake idle for 100 µs at +300 µs"


# --- idle attribution ----------------------------------------------------------------------

# The transfer thread waits 14 ms before each call, and main's dispatch holds 96% of it.
HELD_14_MS = [
    complete("dispatch", 0, 13440), complete("dispatch", 15000, 13440),
    complete("kv_transfer", 14000, 1000, MOONCAKE), complete("kv_transfer", 29000, 1000, MOONCAKE),
]


@pytest.mark.parametrize(("events", "name", "waiting", "idle", "calls", "others", "detail"), [
    # The example of issue 10: idle before each call, nearly all of it under dispatch.
    (HELD_14_MS, "kv_transfer", "*wait*", 28000, 2, {("dispatch", "main"): 0.96},
     "kv_transfer sat idle 14 ms a call (28 ms over 2 calls on thread mooncake; longest 14 ms: "
     "96% dispatch); during 96% of it dispatch ran on thread main"),
    # A gil_wait just before a call is the call's wait; the last call waits in a plain gap.
    (GIL_HELD, "kv_transfer", "gil_wait*", 300, 3,
     {("dispatch", "main"): 2 / 3, ("combine", "main"): 1 / 3},
     "kv_transfer sat idle 100 µs a call (300 µs over 3 calls on thread mooncake; longest "
     "100 µs: 100% dispatch); during 67% of it dispatch ran, 33% combine ran on thread main"),
    # ... unless waits count as work: then only the plain gap is left.
    (GIL_HELD, "kv_transfer", (), 100, 3, {("dispatch", "main"): 1.0},
     "kv_transfer sat idle 33.3 µs a call (100 µs over 3 calls on thread mooncake; longest "
     "100 µs: 100% dispatch); during 100% of it dispatch ran on thread main"),
    # A wait attributed itself: all of its time is idle.
    (GIL_HELD, "gil_wait", "gil_wait*", 200, 2,
     {("dispatch", "main"): 0.5, ("combine", "main"): 0.5},
     "gil_wait sat idle 100 µs a call (200 µs over 2 calls on thread mooncake; longest 100 µs: "
     "100% dispatch); during 50% of it combine ran, 50% dispatch ran on thread main"),
    # Released GIL: the transfer waits only for the trace to reach it and between its calls.
    (GIL_RELEASED, "kv_transfer", "*wait*", 80, 2,
     {("dispatch", "main"): 20 / 80, ("combine", "main"): 10 / 80},
     "kv_transfer sat idle 40 µs a call (80 µs over 2 calls on thread mooncake; longest 70 µs: "
     "14% combine, 14% dispatch); during 25% of it dispatch ran, 12% combine ran on thread "
     "main; no other thread had a span open for 62% of it"),
    # Back to back on its thread: no idle time at all.
    ([complete("dispatch", 0, 100), complete("combine", 100, 100), complete("dispatch", 200, 50),
      complete("kv_transfer", 0, 300, MOONCAKE)],
     "dispatch", "*wait*", 0, 2, {}, "dispatch never sat idle (2 calls on thread main)"),
    # Nested: a call inside a parent waits from the previous sibling's end, not the parent's
    # start; the parent itself never waited. The innermost span on main is named, not "step".
    ([complete("step", 0, 1000), complete("compute", 0, 300), complete("dispatch", 500, 300),
      complete("kv_transfer", 300, 150, MOONCAKE)],
     "dispatch", "*wait*", 200, 1, {("kv_transfer", "mooncake"): 0.75},
     "dispatch sat idle 200 µs a call (1 call on thread main); during 75% of it kv_transfer ran "
     "on thread mooncake; no other thread had a span open for 25% of it"),
    ([complete("step", 0, 1000), complete("compute", 0, 300), complete("dispatch", 500, 300),
      complete("kv_transfer", 300, 150, MOONCAKE)],
     "step", "*wait*", 0, 1, {}, "step never sat idle (1 call on thread main)"),
    # It stretched: a wait nested in the call, while the other thread held the work (the
    # innermost span there: prep inside kv_transfer).
    ([complete("dispatch", 0, 1000), complete("gil_wait", 200, 500),
      complete("kv_transfer", 100, 700, MOONCAKE), complete("prep", 150, 100, MOONCAKE)],
     "dispatch", "*wait*", 500, 1, {("kv_transfer", "mooncake"): 0.9, ("prep", "mooncake"): 0.1},
     "dispatch sat idle 500 µs a call (1 call on thread main); during 90% of it kv_transfer "
     "ran, 10% prep ran on thread mooncake"),
    # The other thread was waiting too: named as a wait, not as holding anything.
    ([complete("kv_transfer", 400, 100, MOONCAKE), complete("wait_kv", 0, 500)],
     "kv_transfer", "*wait*", 400, 1, {("wait_kv", "main"): 1.0},
     "kv_transfer sat idle 400 µs a call (1 call on thread mooncake); during 100% of it "
     "wait_kv waited on thread main"),
    # On two threads: each thread's idle time is attributed to the spans of the others, the
    # span itself on the other thread included.
    ([complete("dispatch", 0, 100), complete("kv_transfer", 100, 100, MOONCAKE),
      complete("kv_transfer", 0, 50, 3), complete("kv_transfer", 150, 50, 3)],
     "kv_transfer", "*wait*", 200, 3,
     {("dispatch", "main"): 0.75, ("kv_transfer", "mooncake"): 0.25,
      ("kv_transfer", "tid 3"): 0.25},
     "kv_transfer sat idle 66.7 µs a call (200 µs over 3 calls on 2 threads; longest 100 µs: "
     "100% dispatch, 50% kv_transfer); during 75% of it dispatch ran on thread main, 25% "
     "kv_transfer ran on thread mooncake, 25% kv_transfer ran on thread tid 3"),
    # Zero-length spans are no calls, and do not end a gap; a glob selects several names.
    ([complete("dispatch", 0, 100), complete("kv_send", 100, 20, MOONCAKE),
      complete("kv_recv", 200, 20, MOONCAKE), complete("tick", 150, 0, MOONCAKE),
      complete("kv_send", 300, 0, MOONCAKE), complete("combine", 120, 80)],
     "kv_*", "*wait*", 180, 2, {("dispatch", "main"): 100 / 180, ("combine", "main"): 80 / 180},
     "kv_* sat idle 90 µs a call (180 µs over 2 calls on thread mooncake; longest 100 µs: 100% "
     "dispatch); during 56% of it dispatch ran, 44% combine ran on thread main"),
])
def test_idle_attribution_names_what_ran_elsewhere_while_a_span_waited(
    events: list[dict[str, Any]], name: str, waiting: str | tuple[str, ...], idle: float,
    calls: int, others: dict[tuple[str, str], float], detail: str,
) -> None:
    result = idle_attribution(trace_of(*events), name, waiting=waiting)
    assert result is not None
    assert result.idle_us == pytest.approx(idle)
    assert result.calls == calls
    assert {(o.name, o.thread): o.share for o in result.others} == pytest.approx(others)
    for (span, thread), share in others.items():
        assert result.share_of(span, thread) == pytest.approx(share)
    assert result.detail == detail
    stored = json.loads(json.dumps(result.as_dict()))
    assert stored["detail"] == detail and stored["calls"] == calls


def test_idle_attribution_keeps_the_longest_wait_and_each_threads_share() -> None:
    result = idle_attribution(trace_of(*GIL_HELD), "kv_transfer", waiting="gil_wait*")
    assert result is not None
    assert (result.idle_calls, result.max_call_idle_us, result.per_call_us) == (3, 100, 100)
    assert result.threads == (("mooncake", 3, 300),)
    assert result.unattributed_us == 0
    assert result.longest is not None
    assert (result.longest.start_us, result.longest.idle_us) == (100, 100)
    assert [(o.name, o.share) for o in result.longest.others] == [("dispatch", 1.0)]
    stored = result.as_dict()
    assert stored["longest"]["at_us"] == 100
    assert stored["others"][0] == {"name": "dispatch", "thread": "main", "pid": 7, "tid": MAIN,
                                   "us": 200, "share": pytest.approx(2 / 3), "waiting": False}
    assert result.share_of("dispatch") == pytest.approx(2 / 3)
    assert result.share_of("decode") == 0


@pytest.mark.parametrize("events", [
    [],
    [complete("dispatch", 0, 100)],
    [complete("kv_transfer", 5, 0, MOONCAKE), complete("dispatch", 0, 100)],  # instants only
    [{"name": "kv_transfer", "ph": "i", "ts": 5, "pid": 7, "tid": MOONCAKE}],
])
def test_idle_attribution_is_none_without_calls_that_take_time(
    events: list[dict[str, Any]],
) -> None:
    assert idle_attribution(trace_of(*events), "kv_transfer") is None


def test_idle_attribution_never_raises_on_a_hand_built_trace() -> None:
    # Mixed pid kinds, a span ending before it starts, a NaN start: no parser would make it.
    odd = Trace(spans=(Span("a", "", 1, 1, 0.0, 5.0), Span("a", "", "x", 1, 10.0, 20.0),
                       Span("a", "", 1, 1, 30.0, 25.0), Span("b", "", 1, 2, math.nan, 30.0)))
    result = idle_attribution(odd, "a")
    assert result is None or json.dumps(result.as_dict())
    clean = idle_attribution(Trace(spans=odd.spans[:2]), "a")
    assert clean is not None
    assert clean.threads == (("pid 1/tid 1", 1, 0.0), ("pid x/tid 1", 1, 10.0))
    with pytest.raises(ValueError, match="at least one name"):
        idle_attribution(trace_of(*GIL_HELD), [])


SEQUENTIAL = st.lists(
    st.tuples(st.sampled_from(["a", "b", "c_wait"]), st.integers(1, 3),
              st.integers(0, 40), st.integers(0, 30)),
    max_size=25,
)


@settings(max_examples=200, deadline=None)
@given(steps=SEQUENTIAL)
def test_at_the_top_of_a_thread_without_waits_the_idle_time_is_the_gaps_before_calls(
    steps: list[tuple[str, int, int, int]],
) -> None:
    # Spans back to back or apart on each thread, never nested: every call is at the top.
    cursor: dict[int, float] = {}
    events = []
    for name, tid, gap, dur in steps:
        start = cursor.get(tid, 0) + gap
        events.append(complete(name, start, dur, tid))
        cursor[tid] = start + dur
    trace = trace_of(*events, names=False)
    result = idle_attribution(trace, "a", waiting=())
    calls = [s for s in trace.spans if s.name == "a" and s.dur_us > 0]
    if not calls:
        assert result is None
        return
    assert result is not None
    expected = 0.0
    for thread in {s.thread for s in calls}:
        starts = {s.start_us for s in calls if s.thread == thread}
        expected += sum(i.dur_us for i in idle_intervals(trace, thread) if i.end_us in starts)
    assert result.idle_us == pytest.approx(expected)
    assert result.calls == len(calls)
    assert 0 <= result.unattributed_us <= result.idle_us + 1e-9
    by_thread: dict[str, float] = {}
    for other in result.others:
        assert 0 < other.share <= 1 + 1e-9
        by_thread[other.thread] = by_thread.get(other.thread, 0) + other.share
    assert all(total <= 1 + 1e-9 for total in by_thread.values())
    json.dumps(result.as_dict())


NESTED = st.lists(
    st.tuples(st.sampled_from(["a", "b", "gil_wait", "wait_kv"]), st.integers(1, 3),
              st.integers(0, 100), st.integers(0, 60)),
    max_size=25,
)


@settings(max_examples=300, deadline=None)
@given(spans=NESTED, name=st.sampled_from(["a", "gil_wait", "*wait*", "b"]))
def test_idle_attribution_is_bounded_on_any_overlapping_spans(
    spans: list[tuple[str, int, int, int]], name: str,
) -> None:
    trace = trace_of(*[complete(n, ts, dur, tid) for n, tid, ts, dur in spans])
    result = idle_attribution(trace, name)
    if result is None:
        return
    assert 0 <= result.idle_us <= result.calls * (trace.end_us - trace.start_us) + 1e-9
    assert result.max_call_idle_us <= result.idle_us + 1e-9
    assert 0 <= result.unattributed_us <= result.idle_us + 1e-9
    assert result.idle_calls <= result.calls
    assert all(0 < o.share <= 1 + 1e-9 for o in result.others)
    json.dumps(result.as_dict())
    assert result.detail

# --- diff ----------------------------------------------------------------------------------


def test_trace_diff_names_the_grown_span_and_flags_new_and_gone_spans() -> None:
    baseline = trace_of(
        *[complete("dispatch", 2000 * i, 1200) for i in range(20)],
        *[complete("combine", 2000 * i + 1500, 400) for i in range(20)],
        complete("old_sync", 0, 300, MOONCAKE), complete("prefill", 0, 1000, MOONCAKE),
        complete("decode", 5000, 2000, MOONCAKE),
    )
    candidate = trace_of(
        *[complete("dispatch", 2000 * i, 1660) for i in range(20)],
        *[complete("combine", 2000 * i + 1700, 410) for i in range(20)],  # +2.5%: unchanged
        complete("gil_wait", 0, 5000, MOONCAKE), complete("prefill", 0, 700, MOONCAKE),
        complete("decode", 5000, 1000, MOONCAKE), complete("decode", 7000, 1000, 3),
    )
    changes = trace_diff(baseline, candidate)
    assert [(c.name, c.status) for c in changes] == [
        ("dispatch", "grew"), ("gil_wait", "new"), ("old_sync", "gone"), ("prefill", "shrank"),
    ]
    dispatch, gil_wait, old_sync, prefill = changes
    assert dispatch.detail == "dispatch grew 38% (p50 1.20 ms -> 1.66 ms, total 24 ms -> 33.2 ms)"
    assert dispatch.relative_change == pytest.approx(9200 / 24000)
    assert gil_wait.detail == "gil_wait is new (1 span, p50 5.00 ms, total 5 ms)"
    assert old_sync.detail == "old_sync is gone (was 1 span, p50 300 µs, total 300 µs)"
    assert (old_sync.relative_change, old_sync.change_us) == (-1.0, -300)
    assert prefill.detail == "prefill shrank 30% (p50 1.00 ms -> 700 µs, total 1 ms -> 700 µs)"
    assert gil_wait.as_dict()["status"] == "new"
    assert [c.name for c in trace_diff(baseline, candidate, min_change=0.02)][:2] == [
        "dispatch", "gil_wait"]
    assert "combine" in [c.name for c in trace_diff(baseline, candidate, min_change=0.02)]


def test_trace_diff_of_a_trace_with_itself_is_empty() -> None:
    trace = trace_of(*GIL_HELD)
    assert trace_diff(trace, trace) == []
    with pytest.raises(ValueError, match="min_change"):
        trace_diff(trace, trace, min_change=-1)
    with pytest.raises(ValueError, match="stall_factor"):
        trace_diff(trace, trace, stall_factor=0.5)


# The case of a CI failure: a per-tile normalisation called 80 times (20 us) is called 20 times
# (15 us) once the tiles merged, but one of the candidate's calls was preempted for 7 ms under
# the suite's load (or paid a cold start): summed, the span "grew 348%".
TILED = [complete("normalize", 100 * i, 20 + (i % 3)) for i in range(80)]
MERGED = [complete("normalize", 100 * i, 15 + (i % 2)) for i in range(20)]
MERGED_STALLED = [complete("normalize", 0, 7000), *MERGED[1:]]


def test_a_stalled_call_does_not_turn_a_span_that_shrank_into_one_that_grew() -> None:
    baseline, candidate = trace_of(*TILED), trace_of(*MERGED_STALLED)
    raw = trace_diff(baseline, candidate)
    assert [(c.name, c.status) for c in raw] == [("normalize", "grew")]
    [change] = trace_diff(baseline, candidate, stall_factor=10)
    assert (change.status, change.baseline_count, change.candidate_count) == ("shrank", 80, 20)
    assert change.candidate_total_us == pytest.approx(9 * 15 + 10 * 16 + 160)  # stall at 10x 16
    assert change.bounded == 1
    assert change.detail.endswith(
        "total 1.68 ms -> 455 µs; 1 call over 10x their span's median in their trace counted "
        "at that bound (stalls))")
    # A change in every call moves the median with it: bounded totals are the raw ones.
    slower = trace_of(*[complete("normalize", 100 * i, 60) for i in range(80)])
    [grew] = trace_diff(baseline, slower, stall_factor=10)
    assert (grew.status, grew.bounded) == ("grew", 0)
    assert grew.candidate_total_us == pytest.approx(80 * 60)
    # Fewer than three calls are summed as they are.
    pair = trace_of(complete("normalize", 0, 15), complete("normalize", 100, 7000))
    assert trace_diff(trace_of(*MERGED[:2]), pair, stall_factor=10)[0].candidate_total_us == 7015


# --- timeline ------------------------------------------------------------------------------


def test_the_timeline_shows_the_held_gil_as_waits_idle_gaps_and_no_overlap() -> None:
    line = timeline(trace_of(*GIL_HELD))

    assert line["threads"] == ["main", "mooncake"] and line["unit"] == "ms"
    assert line["duration"] == 0.55
    assert [w[:2] for w in line["waits"]] == [[1, "gil_wait"], [1, "gil_wait"]]
    assert {s[1] for s in line["spans"]} == {"dispatch", "combine", "kv_transfer"}
    # The spans touch but never run together: no overlap band at all.
    assert line["overlap"] == []
    assert [i for i in line["idle"] if i[0] == 0] == [[0, 0.1, 0.15], [0, 0.25, 0.3],
                                                       [0, 0.4, 0.45]]
    # A wait is not idle time: the thread has a span open, it is blocked.
    assert [i for i in line["idle"] if i[0] == 1] == [[1, 0.0, 0.02], [1, 0.3, 0.4],
                                                       [1, 0.45, 0.55]]


def test_the_timeline_bands_the_time_two_threads_work_together() -> None:
    line = timeline(trace_of(*GIL_RELEASED))

    assert line["overlap"] == [[0.01, 0.09], [0.16, 0.21]]
    assert line["waits"] == [] and line["left_out"] == 0


def test_the_timeline_keeps_the_longest_spans_and_counts_the_rest() -> None:
    spans = [complete("tick", i * 10, 1 + i % 3) for i in range(50)]
    line = timeline(trace_of(*spans, complete("long", 600, 400)), max_spans=10)

    assert len(line["spans"]) == 10 and line["left_out"] == 41
    assert ["long" in s for s in line["spans"]].count(True) == 1
    # Idle gaps come from every span, not only the ones kept for the chart: a gap after each
    # tick (7-9 µs, over the 5 µs floor of 0.5% of this 1 ms trace).
    assert len(line["idle"]) == 50 and line["idle"][-1] == [0, 0.492, 0.6]
