"""System behaviour from Chrome traces: span statistics, overlap, blocking, idle gaps, diffs.

Pure: no Django, stdlib only. A probe writes `trace.json` in the Chrome Trace Event format (see
docs/feedback-contract.md); `parse_trace` turns it into a `Trace` of spans and the
functions below answer the questions a reviewer asks of a timeline:

- `span_stats`: per span name and thread, count, total, p50, p95 and max duration;
- `overlap`: how much of one set of spans' time another set covers ("kv_transfer overlaps
  dispatch for 0.0% of its time");
- `blocked_intervals`: when one thread waits while another thread holds the work;
- `idle_intervals`: gaps in one thread's activity;
- `idle_attribution`: how long a span's thread sat idle around its calls, and which spans ran
  on other threads meanwhile ("kv_transfer sat idle 4.20 ms a call; during 96% of it dispatch
  ran on thread main");
- `trace_diff`: which spans grew or shrank against the baseline trace, and by how much.

Times are microseconds throughout, as in the format (`ts`, `dur`). Span sets are selected by a
name or a sequence of names; each entry matches a span whose name equals it exactly, or, when the
entry contains a glob character (`*`, `?`, `[`), whose name matches it as a case-sensitive
`fnmatch` pattern ("gil_wait*"). Every result has `as_dict()` for JSON storage.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import json
import math
import re
import statistics
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import translate
from functools import cached_property
from types import MappingProxyType
from typing import Any, Literal, TypeVar

Id = int | str
"""A pid or tid: the format allows integers and strings."""
ThreadKey = tuple[Id, Id]
"""(pid, tid)."""

MAX_PROBLEMS = 100
"""Non-fatal problems kept per trace; the rest are counted in one final line."""

_SPAN_PHASES = frozenset({"X", "B", "E", "i", "I"})
_GLOB_CHARS = frozenset("*?[")
_K = TypeVar("_K")


class TraceError(ValueError):
    """The trace cannot be read: not JSON, no events list, an event missing ts, a negative dur."""


@dataclass(frozen=True, slots=True)
class Span:
    """One timed region on one thread; instants are spans with start_us == end_us."""

    name: str
    cat: str
    pid: Id
    tid: Id
    start_us: float
    end_us: float

    @property
    def dur_us(self) -> float:
        return self.end_us - self.start_us

    @property
    def thread(self) -> ThreadKey:
        return (self.pid, self.tid)

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "cat": self.cat, "pid": self.pid, "tid": self.tid,
                "start_us": self.start_us, "end_us": self.end_us, "dur_us": self.dur_us}


@dataclass(frozen=True)
class Trace:
    """Spans sorted by start, display names from the "M" metadata events, and what went wrong.

    `problems` holds non-fatal findings (a stray "E", a "B" never ended, an "X" without dur),
    at most MAX_PROBLEMS of them plus a line counting the rest. `ignored` counts events of
    phases this module does not read (counters, flows, async events, other metadata), by phase.
    The mappings are read-only views.
    """

    spans: tuple[Span, ...]
    thread_names: Mapping[ThreadKey, str] = field(default_factory=dict)
    problems: tuple[str, ...] = ()
    process_names: Mapping[Id, str] = field(default_factory=dict)
    ignored: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Frozen: normalise through object.__setattr__ so a caller's list or dict can't leak in.
        object.__setattr__(self, "spans", tuple(self.spans))
        object.__setattr__(self, "problems", tuple(self.problems))
        object.__setattr__(self, "thread_names", MappingProxyType(dict(self.thread_names)))
        object.__setattr__(self, "process_names", MappingProxyType(dict(self.process_names)))
        object.__setattr__(self, "ignored", MappingProxyType(dict(self.ignored)))

    @cached_property
    def start_us(self) -> float:
        """The earliest span start; 0 for a trace without spans."""
        return min((s.start_us for s in self.spans), default=0.0)

    @cached_property
    def end_us(self) -> float:
        """The latest span end; 0 for a trace without spans."""
        return max((s.end_us for s in self.spans), default=0.0)

    @cached_property
    def threads(self) -> tuple[ThreadKey, ...]:
        """Every thread with a span or a name, in pid then tid order."""
        keys = {s.thread for s in self.spans} | set(self.thread_names)
        return tuple(sorted(keys, key=_thread_order))

    @cached_property
    def _multi_process(self) -> bool:
        return len({pid for pid, _ in self.threads}) > 1

    def thread_label(self, thread: ThreadKey) -> str:
        """The thread's display name: its "thread_name" metadata, else "tid N"; prefixed with
        the process ("process_name" metadata, else "pid N") and "/" when the trace has spans or
        names in more than one process."""
        return _thread_label(thread, self.thread_names, self.process_names, self._multi_process)

    def as_dict(self) -> dict[str, Any]:
        """A summary for storage; the spans themselves stay in the stored trace.json."""
        return {
            "span_count": len(self.spans),
            "start_us": self.start_us,
            "end_us": self.end_us,
            "threads": [{"pid": pid, "tid": tid, "name": self.thread_label((pid, tid))}
                        for pid, tid in self.threads],
            "problems": list(self.problems),
            "ignored": dict(self.ignored),
        }


def parse_trace(data: bytes | str, *, max_events: int = 2_000_000) -> Trace:
    """Read a Chrome trace: the object form {"traceEvents": [...]} or the bare array form.

    Reads phases "X" (complete: ts + dur), "B"/"E" (paired per pid/tid, in ts order, with a
    stack so they nest), "i"/"I" (instants, kept as zero-length spans) and "M" thread_name /
    process_name (display names); counts every other phase in `Trace.ignored`. An array whose
    closing "]" is missing (allowed by the format, left by a killed tracer) is read, with a
    problem noted. Missing pid/tid read as 0; missing name/cat as "".

    Raises TraceError, with a message naming the event, when the input is not JSON, has no
    events list, has more than `max_events` events, or has an event that is not an object,
    has no phase, lacks ts, or has a ts/dur that is not a finite number, a negative dur, or a
    name/cat/pid/tid of the wrong type. Non-fatal problems (a stray or mismatched "E", a "B"
    never ended, an "X" without dur, metadata without a name) go to `Trace.problems`.
    """
    events, problems = _load_events(data)
    if len(events) > max_events:
        raise TraceError(
            f"the trace has {len(events)} events, more than the cap of {max_events}")
    builder = _TraceBuilder(problems)
    for index, event in enumerate(events):
        builder.add(index, event)
    return builder.finish()


@dataclass(frozen=True)
class SpanStats:
    """Durations of the spans of one name on one thread."""

    name: str
    pid: Id
    tid: Id
    thread: str
    count: int
    total_us: float
    p50_us: float
    p95_us: float
    max_us: float

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "pid": self.pid, "tid": self.tid, "thread": self.thread,
                "count": self.count, "total_us": self.total_us, "p50_us": self.p50_us,
                "p95_us": self.p95_us, "max_us": self.max_us}


def span_stats(trace: Trace) -> list[SpanStats]:
    """Per (name, thread): count, total, p50, p95, max of durations; by total descending, then
    name and thread label. Percentiles interpolate linearly between the sorted durations (numpy's
    default), so p50 is the median."""
    groups: dict[tuple[str, ThreadKey], list[float]] = defaultdict(list)
    for span in trace.spans:
        groups[(span.name, span.thread)].append(span.dur_us)
    result = []
    for (name, thread), durations in groups.items():
        durations.sort()
        result.append(SpanStats(
            name=name, pid=thread[0], tid=thread[1], thread=trace.thread_label(thread),
            count=len(durations), total_us=math.fsum(durations),
            p50_us=_percentile(durations, 50), p95_us=_percentile(durations, 95),
            max_us=durations[-1],
        ))
    result.sort(key=lambda s: (-s.total_us, s.name, s.thread))
    return result


@dataclass(frozen=True)
class Overlap:
    """How much of the time of span set `a` (the union over all threads) the union of span set
    `b` covers. `fraction` is overlapped_us / total_a_us, None when `a` has no time."""

    a: tuple[str, ...]
    b: tuple[str, ...]
    a_spans: int
    b_spans: int
    total_a_us: float
    total_b_us: float
    overlapped_us: float
    fraction: float | None

    @property
    def detail(self) -> str:
        a, b = _selection_label(self.a), _selection_label(self.b)
        if self.a_spans == 0:
            return f"no {a} spans in the trace"
        if self.fraction is None:
            return f"{a} spans take no time (instants only)"
        return (f"{a} overlaps {b} for {self.fraction:.1%} of its time "
                f"({_duration(self.overlapped_us)} of {_duration(self.total_a_us)})")

    def as_dict(self) -> dict[str, Any]:
        return {"a": list(self.a), "b": list(self.b), "a_spans": self.a_spans,
                "b_spans": self.b_spans, "total_a_us": self.total_a_us,
                "total_b_us": self.total_b_us, "overlapped_us": self.overlapped_us,
                "fraction": self.fraction, "detail": self.detail}


def overlap(trace: Trace, a: str | Sequence[str], b: str | Sequence[str]) -> Overlap:
    """The share of set `a`'s time, on any thread, during which some span of set `b` is open on
    any thread. Each set's spans are merged into a union of intervals first, so nested or
    concurrent spans count once; instants add nothing. Raises ValueError for an empty set."""
    patterns_a, patterns_b = _patterns(a), _patterns(b)
    spans_a = _select(trace.spans, patterns_a)
    spans_b = _select(trace.spans, patterns_b)
    union_a = _union((s.start_us, s.end_us) for s in spans_a)
    union_b = _union((s.start_us, s.end_us) for s in spans_b)
    total_a = _length(union_a)
    overlapped = _length(_intersect(union_a, union_b))
    return Overlap(
        a=patterns_a, b=patterns_b, a_spans=len(spans_a), b_spans=len(spans_b),
        total_a_us=total_a, total_b_us=_length(union_b), overlapped_us=overlapped,
        fraction=overlapped / total_a if total_a > 0 else None,
    )


@dataclass(frozen=True)
class Interval:
    """A stretch of one thread's time.

    kind "blocked": the thread had a `waiting` span open while other threads (`holders`) had
    `holding` spans open. kind "idle": the thread had no span open.
    """

    kind: Literal["blocked", "idle"]
    thread: str
    pid: Id
    tid: Id
    start_us: float
    end_us: float
    waiting: tuple[str, ...] = ()
    holders: tuple[str, ...] = ()
    holding: tuple[str, ...] = ()
    offset_us: float = 0.0
    """The trace start, so details can say where in the trace the interval sits."""

    @property
    def dur_us(self) -> float:
        return self.end_us - self.start_us

    @property
    def detail(self) -> str:
        at = f"at +{_duration(self.start_us - self.offset_us)}"
        if self.kind == "idle":
            return f"{self.thread} idle for {_duration(self.dur_us)} {at}"
        return (f"{self.thread} waited ({', '.join(self.waiting)}) for {_duration(self.dur_us)} "
                f"{at} while {', '.join(self.holders)} held {', '.join(self.holding)}")

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "thread": self.thread, "pid": self.pid, "tid": self.tid,
                "start_us": self.start_us, "end_us": self.end_us, "dur_us": self.dur_us,
                "waiting": list(self.waiting), "holders": list(self.holders),
                "holding": list(self.holding), "detail": self.detail}


def blocked_intervals(
    trace: Trace, *, waiting: str | Sequence[str], holding: str | Sequence[str],
    min_us: float = 0,
) -> list[Interval]:
    """Maximal intervals during which a span of set `waiting` is open on one thread while a span
    of set `holding` is open on a different thread (e.g. waiting="gil_wait*" on the transfer
    thread, holding=["dispatch", "combine"] on the main thread).

    One interval per waiting thread and stretch; stretches that touch are joined. It names the
    waiting spans, the holding threads and the holding spans seen anywhere in it. Intervals
    shorter than `min_us` are left out. Sorted by start, then thread. Raises ValueError for an
    empty set.
    """
    wait_patterns, hold_patterns = _patterns(waiting), _patterns(holding)
    wait_spans = [s for s in _select(trace.spans, wait_patterns) if s.dur_us > 0]
    hold_spans = [s for s in _select(trace.spans, hold_patterns) if s.dur_us > 0]
    by_thread: dict[ThreadKey, list[Span]] = defaultdict(list)
    for span in wait_spans:
        by_thread[span.thread].append(span)
    result: list[Interval] = []
    for thread, mine in by_thread.items():
        others = [s for s in hold_spans if s.thread != thread]
        result.extend(_blocked_on(trace, thread, mine, others, min_us))
    result.sort(key=lambda i: (i.start_us, i.thread))
    return result


def idle_intervals(
    trace: Trace, thread: ThreadKey | int | str, *,
    within: tuple[float, float] | None = None, min_us: float = 0,
) -> list[Interval]:
    """Gaps of at least `min_us` in which `thread` has no span with a duration open, within
    `within` (start_us, end_us; default: the whole trace, first start to last end on any thread).

    `thread` is a (pid, tid) pair, a tid, or a thread name / display label. Raises ValueError
    when it names no thread of the trace or several.
    """
    key = _resolve_thread(trace, thread)
    lo, hi = within if within is not None else (trace.start_us, trace.end_us)
    busy = _union((s.start_us, s.end_us) for s in trace.spans if s.thread == key)
    label = trace.thread_label(key)
    gaps = []
    cursor = lo
    for start, end in [*busy, (hi, hi)]:
        gap_end = min(start, hi)
        if gap_end > cursor and gap_end - cursor >= min_us:
            gaps.append(Interval(kind="idle", thread=label, pid=key[0], tid=key[1],
                                 start_us=cursor, end_us=gap_end, offset_us=trace.start_us))
        cursor = max(cursor, end)
        if cursor >= hi:
            break
    return gaps


WAIT_SPANS: tuple[str, ...] = ("*wait*",)
"""Spans that are waits, not work, unless told otherwise ("gil_wait", "wait_kv"): for
`idle_attribution`, time in one inside a call, or just before it, is the call's idle time."""


@dataclass(frozen=True)
class IdleShare:
    """A span on another thread, and how much of some idle time it had open (innermost there)."""

    name: str
    thread: str
    pid: Id
    tid: Id
    us: float
    share: float
    waiting: bool = False
    """The span is itself a wait (matches the attribution's `waiting`): it held nothing."""

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "thread": self.thread, "pid": self.pid, "tid": self.tid,
                "us": self.us, "share": self.share, "waiting": self.waiting}


@dataclass(frozen=True)
class CallIdle:
    """The idle time of one call: its thread idle just before it, or in a wait inside it."""

    thread: str
    start_us: float
    end_us: float
    idle_us: float
    others: tuple[IdleShare, ...]
    offset_us: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"thread": self.thread, "start_us": self.start_us, "end_us": self.end_us,
                "at_us": self.start_us - self.offset_us, "idle_us": self.idle_us,
                "others": [o.as_dict() for o in self.others]}


@dataclass(frozen=True)
class Attribution:
    """The idle time of the calls of span set `name`, and what other threads ran meanwhile.

    A call's idle time is the stretch just before it starts in which its thread had nothing
    open at the call's nesting level but `waiting` spans ("gil_wait" just before
    "kv_transfer": it waited), since the previous call or other span at that level ended
    (for a call at the top of its thread without waits before it: the `idle_intervals` gap
    that ends where it starts; for a call nested in a parent: the time in the parent since
    the parent started or the previous sibling ended); plus the time inside it spent in
    `waiting` spans nested at any depth (it stretched). A call that is itself a wait is idle
    for all of its time but the work nested in it.

    `others` gives, for each span name and other thread, the idle time during which that span
    was the innermost open span of that thread, by time descending; `share` divides by
    `idle_us`. A thread's shares add up to at most 1; several threads' can add up to more.
    `unattributed_us` is idle time in which no other thread had any span open. `longest` is
    the call with the most idle time, with its own attribution.
    """

    name: tuple[str, ...]
    waiting: tuple[str, ...]
    calls: int
    idle_calls: int
    idle_us: float
    max_call_idle_us: float
    unattributed_us: float
    threads: tuple[tuple[str, int, float], ...]
    """(thread label, calls, idle µs) per thread with calls, in thread order."""
    others: tuple[IdleShare, ...]
    longest: CallIdle | None = None

    @property
    def per_call_us(self) -> float:
        return self.idle_us / self.calls if self.calls else 0.0

    def share_of(self, name: str, thread: str | None = None) -> float:
        """The share of the idle time during which `name` ran on `thread` (any other thread
        when None); 0 when it never did."""
        return math.fsum(o.share for o in self.others
                         if o.name == name and (thread is None or o.thread == thread))

    @property
    def detail(self) -> str:
        """E.g. "kv_transfer sat idle 838 µs a call (302 ms over 360 calls on thread mooncake;
        longest 4.64 ms: 46% dispatch, 45% combine); during 31% of it wait_kv waited, 27%
        compute ran on thread MainThread"."""
        name = _selection_label(self.name)
        where = (f"thread {self.threads[0][0]}" if len(self.threads) == 1
                 else f"{len(self.threads)} threads")
        calls = f"{self.calls} call{'' if self.calls == 1 else 's'} on {where}"
        if self.idle_us <= 0:
            return f"{name} never sat idle ({calls})"
        text = f"{name} sat idle {_duration(self.per_call_us)} a call"
        if self.calls == 1:
            text += f" ({calls})"
        else:
            text += f" ({_duration(self.idle_us)} over {calls}"
            if self.longest is not None:
                text += f"; longest {_duration(self.longest.idle_us)}"
                top = [o for o in self.longest.others if o.share >= 0.01][:2]
                if top:
                    text += ": " + ", ".join(f"{o.share:.0%} {o.name}" for o in top)
            text += ")"
        during = _during([o for o in self.others if o.share >= 0.01][:4])
        if during:
            text += f"; {during}"
        unattributed = self.unattributed_us / self.idle_us
        if unattributed >= 0.05:
            text += f"; no other thread had a span open for {unattributed:.0%} of it"
        return text

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": list(self.name), "waiting": list(self.waiting), "calls": self.calls,
            "idle_calls": self.idle_calls, "idle_us": self.idle_us,
            "per_call_us": self.per_call_us, "max_call_idle_us": self.max_call_idle_us,
            "unattributed_us": self.unattributed_us,
            "threads": [{"thread": t, "calls": n, "idle_us": us} for t, n, us in self.threads],
            "others": [o.as_dict() for o in self.others],
            "longest": self.longest.as_dict() if self.longest is not None else None,
            "detail": self.detail,
        }


def _during(shares: Sequence[IdleShare]) -> str:
    """'during 96% of it dispatch ran on thread main, 3% decode waited on thread worker';
    entries in a row on one thread name it once."""
    parts: list[str] = []
    for index, share in enumerate(shares):
        verb = "waited" if share.waiting else "ran"
        part = (f"during {share.share:.0%} of it {share.name} {verb}" if index == 0
                else f"{share.share:.0%} {share.name} {verb}")
        following = shares[index + 1] if index + 1 < len(shares) else None
        if following is None or following.thread != share.thread:
            part += f" on thread {share.thread}"
        parts.append(part)
    return ", ".join(parts)


def idle_attribution(
    trace: Trace, name: str | Sequence[str], *,
    waiting: str | Sequence[str] = WAIT_SPANS, limit: int = 20,
) -> Attribution | None:
    """For the calls of span set `name`: how long their threads sat idle (see `Attribution`),
    in all and per call, and which spans on other threads ran during that idle time, each with
    its share ("kv_transfer sat idle 4.20 ms a call ...; during 96% of it dispatch ran on
    thread main"). At most `limit` entries in `others`, the largest.

    Calls are the spans of `name` that take time; instants are not calls. None when there
    are none, or when the trace cannot be attributed (it never raises on an odd trace). Pass
    `waiting=()` to count every span as work. Raises ValueError for an empty selection.
    """
    patterns = _patterns(name)
    wait_patterns = _patterns(waiting) if waiting else ()
    try:
        return _idle_attribution(trace, patterns, wait_patterns, limit)
    except (TypeError, ValueError, ArithmeticError):  # a hand-built Trace with odd values
        return None


def _idle_attribution(trace: Trace, patterns: tuple[str, ...], wait_patterns: tuple[str, ...],
                      limit: int) -> Attribution | None:
    is_call = _matcher(patterns)
    is_wait = _matcher(wait_patterns) if wait_patterns else (lambda _: False)
    by_thread: dict[ThreadKey, list[Span]] = defaultdict(list)
    for span in trace.spans:
        if span.dur_us > 0:
            by_thread[span.thread].append(span)
    call_threads = [t for t in sorted(by_thread, key=_thread_order)
                    if any(is_call(s.name) for s in by_thread[t])]
    if not call_threads:
        return None
    timelines = {t: _innermost(spans, is_wait) for t, spans in by_thread.items()}
    calls = 0
    idle_us = 0.0
    unattributed = 0.0
    per_thread: list[tuple[str, int, float]] = []
    shared: dict[tuple[str, ThreadKey, bool], float] = defaultdict(float)
    idle_calls = 0
    longest: tuple[float, ThreadKey, Span, list[tuple[float, float]]] | None = None
    for thread in call_threads:
        spans = by_thread[thread]
        per_call = _calls_idle(spans, is_call, is_wait, trace.start_us)
        idle = _union(i for _, intervals in per_call for i in intervals)
        thread_idle = _length(idle)
        calls += len(per_call)
        idle_us += thread_idle
        per_thread.append((trace.thread_label(thread), len(per_call), thread_idle))
        for call, intervals in per_call:
            length = _length(intervals)
            idle_calls += length > 0
            if length > 0 and (longest is None or length > longest[0]):
                longest = (length, thread, call, intervals)
        others = {t: line for t, line in timelines.items() if t != thread}
        _attribute(idle, others, shared)
        covered = _union((s.start_us, s.end_us) for t in others for s in by_thread[t])
        unattributed += thread_idle - _length(_intersect(idle, covered))
    total = idle_us
    if not math.isfinite(total):
        return None
    result_others = _shares(trace, shared, total, limit)
    call_idle = None
    if longest is not None:
        length, thread, call, intervals = longest
        mine: dict[tuple[str, ThreadKey, bool], float] = defaultdict(float)
        _attribute(intervals, {t: line for t, line in timelines.items() if t != thread}, mine)
        call_idle = CallIdle(thread=trace.thread_label(thread), start_us=call.start_us,
                             end_us=call.end_us, idle_us=length,
                             others=_shares(trace, mine, length, 3), offset_us=trace.start_us)
    return Attribution(
        name=patterns, waiting=wait_patterns, calls=calls, idle_calls=idle_calls,
        idle_us=total, max_call_idle_us=longest[0] if longest is not None else 0.0,
        unattributed_us=max(0.0, unattributed), threads=tuple(per_thread),
        others=result_others, longest=call_idle,
    )


def _calls_idle(spans: list[Span], is_call: Callable[[str], bool],
                is_wait: Callable[[str], bool], lo: float
                ) -> list[tuple[Span, list[tuple[float, float]]]]:
    """Each call on one thread with its idle intervals: the gap before it at its own nesting
    level (since its parent started or its previous sibling ended; waits that are not calls
    are no siblings), the waits inside it, and, for a call that is a wait, itself less the
    work nested in it."""
    order = sorted(spans, key=lambda s: (s.start_us, -s.end_us))
    work = [s for s in order if not is_wait(s.name)]
    work_starts = [s.start_us for s in work]
    waits = _union((s.start_us, s.end_us) for s in order if is_wait(s.name))
    wait_starts = [start for start, _ in waits]
    stack: list[list[float]] = [[math.inf, lo, lo]]  # [end, start, end of the last child]
    result = []
    for span in (s for s in order if is_call(s.name) or not is_wait(s.name)):
        while len(stack) > 1 and stack[-1][0] <= span.start_us:
            done = stack.pop()
            stack[-1][2] = max(stack[-1][2], done[0])
        parent = stack[-1]
        stack.append([span.end_us, span.start_us, span.start_us])
        if not is_call(span.name):
            continue
        gap_start = max(parent[1], parent[2])
        intervals = [(gap_start, span.start_us)] if span.start_us > gap_start else []
        if is_wait(span.name):
            first = bisect.bisect_left(work_starts, span.start_us)
            inner = _union((w.start_us, w.end_us)
                           for w in work[first:bisect.bisect_left(work_starts, span.end_us)]
                           if w.end_us <= span.end_us)
            intervals += _subtract([(span.start_us, span.end_us)], inner)
        else:
            intervals += _clip(waits, wait_starts, span.start_us, span.end_us)
        result.append((span, _union(intervals)))
    return result


def _clip(intervals: list[tuple[float, float]], starts: list[float], lo: float,
          hi: float) -> list[tuple[float, float]]:
    """The parts of sorted, disjoint `intervals` (whose starts are `starts`) inside [lo, hi]."""
    result = []
    for index in range(max(bisect.bisect_right(starts, lo) - 1, 0), len(intervals)):
        start, end = intervals[index]
        if start >= hi:
            break
        if end > lo:
            result.append((max(start, lo), min(end, hi)))
    return result


def _subtract(a: Sequence[tuple[float, float]],
              b: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """The parts of sorted, disjoint `a` outside sorted, disjoint `b`."""
    result = []
    j = 0
    for start, end in a:
        cursor = start
        while j < len(b) and b[j][1] <= cursor:
            j += 1
        k = j
        while k < len(b) and b[k][0] < end:
            if b[k][0] > cursor:
                result.append((cursor, b[k][0]))
            cursor = max(cursor, b[k][1])
            k += 1
        if cursor < end:
            result.append((cursor, end))
    return result


_Segment = tuple[float, float, str, bool]
"""(start, end, span name, is a wait): a stretch in which that span is innermost on a thread."""


def _innermost(spans: list[Span], is_wait: Callable[[str], bool]) -> list[_Segment]:
    """One thread's timeline as disjoint segments, each naming the innermost open span: of
    the spans open there, the last to start (then the first to end)."""
    order = sorted(spans, key=lambda s: (s.start_us, -s.end_us))
    bounds = sorted({s.start_us for s in order} | {s.end_us for s in order})
    heap: list[tuple[float, float, int]] = []
    segments: list[_Segment] = []
    index = 0
    for left, right in itertools.pairwise(bounds):
        while index < len(order) and order[index].start_us <= left:
            span = order[index]
            heapq.heappush(heap, (-span.start_us, span.end_us, index))
            index += 1
        while heap and heap[0][1] <= left:
            heapq.heappop(heap)
        if not heap:
            continue
        span = order[heap[0][2]]
        waits = is_wait(span.name)
        if segments and segments[-1][1] == left and segments[-1][2:] == (span.name, waits):
            segments[-1] = (segments[-1][0], right, span.name, waits)
        else:
            segments.append((left, right, span.name, waits))
    return segments


def _attribute(idle: Sequence[tuple[float, float]], timelines: Mapping[ThreadKey, list[_Segment]],
               into: dict[tuple[str, ThreadKey, bool], float]) -> None:
    """Add, per (span name, thread, is a wait), the part of `idle` each segment covers."""
    for thread, segments in timelines.items():
        i = j = 0
        while i < len(idle) and j < len(segments):
            start, end, name, waits = segments[j]
            lo, hi = max(idle[i][0], start), min(idle[i][1], end)
            if hi > lo:
                into[(name, thread, waits)] += hi - lo
            if idle[i][1] < end:
                i += 1
            else:
                j += 1


def _shares(trace: Trace, amounts: Mapping[tuple[str, ThreadKey, bool], float], total: float,
            limit: int) -> tuple[IdleShare, ...]:
    rows = [IdleShare(name=name, thread=trace.thread_label(thread), pid=thread[0],
                      tid=thread[1], us=us, share=us / total if total > 0 else 0.0,
                      waiting=waits)
            for (name, thread, waits), us in amounts.items() if us > 0]
    rows.sort(key=lambda r: (-r.us, r.name, r.thread))
    return tuple(rows[:max(limit, 0)])


@dataclass(frozen=True)
class SpanChange:
    """One span name's time in the baseline and candidate traces, summed over threads.

    change_us is candidate total - baseline total; relative_change divides it by the baseline
    total (None for a new span or a zero baseline; -1.0 for a gone one). `bounded`: the calls,
    both sides together, counted at trace_diff's stall bound rather than at their length.
    """

    name: str
    status: Literal["grew", "shrank", "new", "gone"]
    baseline_count: int
    baseline_total_us: float
    baseline_p50_us: float | None
    candidate_count: int
    candidate_total_us: float
    candidate_p50_us: float | None
    change_us: float
    relative_change: float | None
    bounded: int = 0
    stall_factor: float | None = None

    @property
    def detail(self) -> str:
        base_p50 = _duration(self.baseline_p50_us or 0, keep_zeros=True)
        cand_p50 = _duration(self.candidate_p50_us or 0, keep_zeros=True)
        base_total = _duration(self.baseline_total_us)
        cand_total = _duration(self.candidate_total_us)
        if self.status == "new":
            return (f"{self.name} is new ({_spans(self.candidate_count)}, p50 {cand_p50}, "
                    f"total {cand_total})")
        if self.status == "gone":
            return (f"{self.name} is gone (was {_spans(self.baseline_count)}, p50 {base_p50}, "
                    f"total {base_total})")
        by = "" if self.relative_change is None else f" {abs(self.relative_change):.0%}"
        bounded = "" if not self.bounded else (
            f"; {_calls(self.bounded)} over {self.stall_factor:g}x their span's median in "
            "their trace counted at that bound (stalls)")
        return (f"{self.name} {self.status}{by} (p50 {base_p50} -> {cand_p50}, "
                f"total {base_total} -> {cand_total}{bounded})")

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status,
                "baseline_count": self.baseline_count,
                "baseline_total_us": self.baseline_total_us,
                "baseline_p50_us": self.baseline_p50_us,
                "candidate_count": self.candidate_count,
                "candidate_total_us": self.candidate_total_us,
                "candidate_p50_us": self.candidate_p50_us, "change_us": self.change_us,
                "relative_change": self.relative_change, "bounded": self.bounded,
                "detail": self.detail}


def trace_diff(baseline: Trace, candidate: Trace, *, min_change: float = 0.05,
               stall_factor: float | None = None) -> list[SpanChange]:
    """Span names whose total time (summed over threads) changed between the traces.

    A name in both traces is reported when its total changed by at least `min_change` of the
    baseline total (any change when the baseline total is 0); a name in one trace only is always
    reported, as "new" or "gone". Sorted by the absolute change in total time, largest first,
    then name. `stall_factor`: totals are `bounded_total`s (a call stalled by a loaded machine,
    or paying a first call's cold start, counts at most that many times its span's median).
    Raises ValueError for a negative `min_change` or a `stall_factor` under 1.
    """
    if min_change < 0:
        raise ValueError(f"min_change must be >= 0, not {min_change}")
    if stall_factor is not None and stall_factor < 1:
        raise ValueError(f"stall_factor must be >= 1, not {stall_factor}")
    before, after = _durations_by_name(baseline), _durations_by_name(candidate)
    changes = []
    for name in before.keys() | after.keys():
        change = _span_change(name, before.get(name), after.get(name), min_change, stall_factor)
        if change is not None:
            changes.append(change)
    changes.sort(key=lambda c: (-abs(c.change_us), c.name))
    return changes


TIMELINE_SPANS = 600
"""Spans a timeline keeps (the longest); a chart of more reads as noise and weighs the page."""
TIMELINE_MIN_IDLE = 0.005
"""Idle gaps shorter than this share of the trace are left off a timeline."""


def timeline(trace: Trace, *, waiting: str | Sequence[str] = WAIT_SPANS,
             max_spans: int = TIMELINE_SPANS) -> dict[str, Any]:
    """The trace as a per-thread timeline for a chart, in milliseconds from the trace start.

    `threads`: labels, one row each; `spans`, `waits`: [row, name, start, end] (waits are the
    spans matching `waiting`: time a thread was blocked, not working); `idle`: [row, start, end],
    gaps of at least TIMELINE_MIN_IDLE of the trace with nothing open on the thread; `overlap`:
    [start, end], when two threads or more worked at once. The `max_spans` longest spans are
    kept (`left_out` counts the rest); idle and overlap are computed on every span.
    """
    rows = {thread: i for i, thread in enumerate(trace.threads)}
    origin = trace.start_us
    wait_patterns = _patterns(waiting)
    timed = [s for s in trace.spans if s.dur_us > 0]
    waits = set(_select(timed, wait_patterns))

    def ms(us: float) -> float:
        return round((us - origin) / 1000, 4)

    kept = sorted(timed, key=lambda s: -s.dur_us)[:max_spans]
    kept.sort(key=lambda s: (s.start_us, rows[s.thread]))
    min_idle = (trace.end_us - trace.start_us) * TIMELINE_MIN_IDLE
    idle = [[rows[key], ms(gap.start_us), ms(gap.end_us)] for key in rows
            if any(s.thread == key for s in timed)
            for gap in idle_intervals(trace, key, min_us=min_idle)]
    working = [_union((s.start_us, s.end_us) for s in timed
                      if s.thread == key and s not in waits) for key in rows]
    return {
        "unit": "ms", "duration": ms(trace.end_us),
        "threads": [trace.thread_label(key) for key in rows],
        "spans": [[rows[s.thread], s.name, ms(s.start_us), ms(s.end_us)]
                  for s in kept if s not in waits],
        "waits": [[rows[s.thread], s.name, ms(s.start_us), ms(s.end_us)]
                  for s in kept if s in waits],
        "idle": idle,
        "overlap": [[ms(start), ms(end)] for start, end in _at_least_two(working)],
        "left_out": len(timed) - len(kept),
    }


def _at_least_two(per_thread: Sequence[Sequence[tuple[float, float]]]
                  ) -> list[tuple[float, float]]:
    """The time covered by two of the (each disjoint) interval lists or more."""
    edges = sorted(itertools.chain.from_iterable(
        ((start, 1), (end, -1)) for intervals in per_thread for start, end in intervals))
    result: list[tuple[float, float]] = []
    open_count, since = 0, 0.0
    for at, step in edges:
        before = open_count
        open_count += step
        if before < 2 <= open_count:
            since = at
        elif open_count < 2 <= before and at > since:
            result.append((since, at))
    return _union(result)


# --- parsing -------------------------------------------------------------------------------


class _Problems:
    def __init__(self) -> None:
        self.kept: list[str] = []
        self.dropped = 0

    def add(self, message: str) -> None:
        if len(self.kept) < MAX_PROBLEMS:
            self.kept.append(message)
        else:
            self.dropped += 1

    def as_tuple(self) -> tuple[str, ...]:
        more = [f"... and {self.dropped} more problems"] if self.dropped else []
        return (*self.kept, *more)


def _load_events(data: bytes | str) -> tuple[list[Any], _Problems]:
    problems = _Problems()
    try:
        document = json.loads(data)
    except RecursionError as exc:
        raise TraceError("the trace is nested too deeply to be a trace") from exc
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, int digit limits
        document = _load_unterminated_array(data, exc)
        problems.add("the events array has no closing ']'")
    if isinstance(document, list):
        return document, problems
    if isinstance(document, dict):
        events = document.get("traceEvents")
        if events is None:
            raise TraceError("the trace object has no traceEvents list")
        if not isinstance(events, list):
            raise TraceError(f"traceEvents is {_kind(events)}, not a list of events")
        return events, problems
    raise TraceError("a trace is a JSON object with a traceEvents list or a JSON array of "
                     f"events, not {_kind(document)}")


def _load_unterminated_array(data: bytes | str, error: ValueError) -> Any:
    """The format lets the array form end without "]"; anything else re-raises `error`."""
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
    except UnicodeDecodeError:
        raise TraceError(f"the trace is not UTF-8 JSON: {error}") from error
    text = text.strip()
    if text.startswith("[") and not text.endswith("]"):
        try:
            return json.loads(text.rstrip(",") + "]")
        except (ValueError, RecursionError):
            pass
    raise TraceError(f"the trace is not valid JSON: {error}") from error


@dataclass(frozen=True, slots=True)
class _Mark:
    """A "B" or "E" event waiting to be paired."""

    ts: float
    index: int
    begin: bool
    name: str
    cat: str


class _TraceBuilder:
    def __init__(self, problems: _Problems) -> None:
        self.problems = problems
        self.spans: list[Span] = []
        self.marks: dict[ThreadKey, list[_Mark]] = defaultdict(list)
        self.thread_names: dict[ThreadKey, str] = {}
        self.process_names: dict[Id, str] = {}
        self.ignored: Counter[str] = Counter()

    def add(self, index: int, event: Any) -> None:
        if not isinstance(event, dict):
            raise TraceError(f"event {index} is {_kind(event)}, not an object")
        phase = event.get("ph")
        if not isinstance(phase, str):
            raise TraceError(f"event {index} has no phase (ph)")
        if phase == "M":
            self._metadata(index, event)
            return
        if phase not in _SPAN_PHASES:
            self.ignored[phase] += 1
            return
        name = _text(event, "name", index)
        where = f"event {index} ({phase} {name!r})"
        if "ts" not in event:
            raise TraceError(f"{where} has no ts")
        ts = _number(event["ts"], f"{where} ts")
        thread = (_id(event, "pid", where), _id(event, "tid", where))
        cat = _text(event, "cat", index)
        if phase == "X":
            self._complete(where, event, name, cat, thread, ts)
        elif phase in ("B", "E"):
            self.marks[thread].append(_Mark(ts, index, phase == "B", name, cat))
        else:
            self.spans.append(Span(name, cat, thread[0], thread[1], ts, ts))

    def _complete(self, where: str, event: dict[str, Any], name: str, cat: str,
                  thread: ThreadKey, ts: float) -> None:
        if "dur" not in event:
            self.problems.add(f"{where} has no dur; left out")
            return
        dur = _number(event["dur"], f"{where} dur")
        if dur < 0:
            raise TraceError(f"{where} has a negative dur ({dur:g})")
        if not math.isfinite(ts + dur):
            raise TraceError(f"{where} ends past the largest representable time")
        self.spans.append(Span(name, cat, thread[0], thread[1], ts, ts + dur))

    def _metadata(self, index: int, event: dict[str, Any]) -> None:
        kind = event.get("name")
        if kind not in ("thread_name", "process_name"):
            self.ignored["M"] += 1
            return
        args = event.get("args")
        value = args.get("name") if isinstance(args, dict) else None
        where = f"event {index} (M {kind!r})"
        if not isinstance(value, str):
            self.problems.add(f"{where} has no args.name; left out")
            return
        pid = _id(event, "pid", where)
        if kind == "thread_name":
            self.thread_names[(pid, _id(event, "tid", where))] = value
        else:
            self.process_names[pid] = value

    def finish(self) -> Trace:
        label = self._labeller()
        for thread, marks in self.marks.items():
            self._pair(thread, marks, label(thread))
        self.spans.sort(key=lambda s: (s.start_us, s.end_us))
        return Trace(spans=tuple(self.spans), thread_names=self.thread_names,
                     problems=self.problems.as_tuple(), process_names=self.process_names,
                     ignored=dict(self.ignored))

    def _labeller(self) -> Callable[[ThreadKey], str]:
        pids = {s.pid for s in self.spans} | {pid for pid, _ in self.marks}
        pids |= {pid for pid, _ in self.thread_names}
        multi = len(pids) > 1
        return lambda key: _thread_label(key, self.thread_names, self.process_names, multi)

    def _pair(self, thread: ThreadKey, marks: list[_Mark], label: str) -> None:
        # Writers emit B/E in time order per thread, but files may interleave threads or be
        # merged; a stable sort keeps file order for equal timestamps.
        marks.sort(key=lambda m: m.ts)
        stack: list[_Mark] = []
        for mark in marks:
            if mark.begin:
                stack.append(mark)
                continue
            if not stack:
                self.problems.add(f"event {mark.index} (E {mark.name!r}) on {label} at ts "
                                  f"{mark.ts:g} has no open B; left out")
                continue
            begin = stack.pop()
            if mark.name and mark.name != begin.name:
                self.problems.add(f"event {mark.index} (E {mark.name!r}) on {label} closes "
                                  f"B {begin.name!r} (event {begin.index})")
            self.spans.append(Span(begin.name, begin.cat, thread[0], thread[1],
                                   begin.ts, mark.ts))
        for begin in stack:
            self.problems.add(f"event {begin.index} (B {begin.name!r}) on {label} never "
                              "ended; left out")


def _kind(value: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
             int: "a number", float: "a number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TraceError(f"{what} is {_kind(value)}, not a number")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise TraceError(f"{what} is not a finite number")
    return number


def _text(event: dict[str, Any], key: str, index: int) -> str:
    value = event.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise TraceError(f"event {index} {key} is {_kind(value)}, not a string")
    return value


def _id(event: dict[str, Any], key: str, where: str) -> Id:
    value = event.get(key)
    if value is None:
        return 0
    if isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise TraceError(f"{where} {key} is {_kind(value)}, not an integer or string")


def _thread_label(thread: ThreadKey, thread_names: Mapping[ThreadKey, str],
                  process_names: Mapping[Id, str], multi_process: bool) -> str:
    pid, tid = thread
    name = thread_names.get(thread) or f"tid {tid}"
    if not multi_process:
        return name
    return f"{process_names.get(pid) or f'pid {pid}'}/{name}"


def _thread_order(thread: ThreadKey) -> tuple[bool, Id, bool, Id]:
    # Integers before strings; each compared only with its own kind.
    pid, tid = thread
    return (isinstance(pid, str), pid, isinstance(tid, str), tid)


# --- selection and intervals ---------------------------------------------------------------


def _patterns(selection: str | Sequence[str]) -> tuple[str, ...]:
    patterns = (selection,) if isinstance(selection, str) else tuple(selection)
    if not patterns:
        raise ValueError("a span selection needs at least one name or pattern")
    return patterns


def _matcher(patterns: Sequence[str]) -> Callable[[str], bool]:
    exact = set(patterns)
    globs = [p for p in patterns if _GLOB_CHARS & set(p)]
    if not globs:
        return exact.__contains__
    regex = re.compile("|".join(f"(?:{translate(p)})" for p in globs))
    return lambda name: name in exact or regex.match(name) is not None


def _select(spans: Iterable[Span], patterns: Sequence[str]) -> list[Span]:
    matches = _matcher(patterns)
    return [s for s in spans if matches(s.name)]


def _selection_label(patterns: Sequence[str]) -> str:
    return "|".join(patterns)


def _union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted, disjoint intervals covering the positive-length inputs; touching ones join."""
    merged: list[tuple[float, float]] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def _intersect(a: Sequence[tuple[float, float]],
               b: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """The intersection of two results of `_union`."""
    result = []
    i = j = 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if end > start:
            result.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return result


def _length(intervals: Iterable[tuple[float, float]]) -> float:
    return math.fsum(end - start for start, end in intervals)


def _blocked_on(trace: Trace, thread: ThreadKey, mine: list[Span], others: list[Span],
                min_us: float) -> list[Interval]:
    # A sweep over span boundaries: between two boundaries the open spans do not change.
    edges: list[tuple[float, int, bool, str, str]] = []
    for span in mine:
        edges += [(span.start_us, 1, True, span.name, ""), (span.end_us, -1, True, span.name, "")]
    for span in others:
        holder = trace.thread_label(span.thread)
        edges += [(span.start_us, 1, False, span.name, holder),
                  (span.end_us, -1, False, span.name, holder)]
    edges.sort(key=lambda e: e[0])
    waits: dict[str, int] = {}
    holds: dict[tuple[str, str], int] = {}
    label = trace.thread_label(thread)
    result: list[Interval] = []
    open_at: float | None = None
    seen_waits: set[str] = set()
    seen_holds: set[tuple[str, str]] = set()
    for position, (ts, delta, is_wait, name, holder) in enumerate(edges):
        if is_wait:
            _count(waits, name, delta)
        else:
            _count(holds, (name, holder), delta)
        if position + 1 < len(edges) and edges[position + 1][0] == ts:
            continue  # apply every edge at this instant before judging the state
        if waits and holds:
            if open_at is None:
                open_at = ts
            seen_waits |= waits.keys()
            seen_holds |= holds.keys()
        elif open_at is not None:
            if ts - open_at >= min_us:
                result.append(Interval(
                    kind="blocked", thread=label, pid=thread[0], tid=thread[1],
                    start_us=open_at, end_us=ts, waiting=tuple(sorted(seen_waits)),
                    holders=tuple(sorted({h for _, h in seen_holds})),
                    holding=tuple(sorted({n for n, _ in seen_holds})),
                    offset_us=trace.start_us,
                ))
            open_at = None
            seen_waits, seen_holds = set(), set()
    return result


def _count(open_spans: dict[_K, int], key: _K, delta: int) -> None:
    """Count spans open per key, forgetting keys with none open."""
    count = open_spans.get(key, 0) + delta
    if count:
        open_spans[key] = count
    else:
        del open_spans[key]


def _resolve_thread(trace: Trace, thread: ThreadKey | int | str) -> ThreadKey:
    if isinstance(thread, tuple):
        if thread not in trace.threads:
            raise ValueError(f"the trace has no thread {thread!r}")
        return thread
    if isinstance(thread, str):
        matches = [k for k in trace.threads
                   if thread in (trace.thread_names.get(k), trace.thread_label(k))]
        matches = matches or [k for k in trace.threads if k[1] == thread]
    else:
        matches = [k for k in trace.threads if k[1] == thread]
    if len(matches) != 1:
        found = "no thread" if not matches else f"{len(matches)} threads"
        raise ValueError(f"{thread!r} names {found} of the trace; pass a (pid, tid) pair")
    return matches[0]


# --- statistics and diff -------------------------------------------------------------------


def _percentile(ordered: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) of sorted values, interpolating linearly between ranks."""
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _durations_by_name(trace: Trace) -> dict[str, list[float]]:
    groups: dict[str, list[float]] = defaultdict(list)
    for span in trace.spans:
        groups[span.name].append(span.dur_us)
    for durations in groups.values():
        durations.sort()
    return groups


def bounded_total(durations: Sequence[float], stall_factor: float | None) -> tuple[float, int]:
    """The calls' total time with each call counted at most `stall_factor` times the median
    call (None: no bound), and how many calls were bounded. Fewer than three calls are summed
    as they are: their median is no typical call. A loaded machine that preempts one call of a
    20-microsecond span for 7 ms (or a first call that pays a cold start) changes the span's
    total 20-fold, not its calls; a change in every call moves the median with it."""
    if stall_factor is None or len(durations) < 3:
        return math.fsum(durations), 0
    bound = stall_factor * statistics.median(durations)
    return math.fsum(min(d, bound) for d in durations), sum(d > bound for d in durations)


def _span_change(name: str, before: list[float] | None, after: list[float] | None,
                 min_change: float, stall_factor: float | None = None) -> SpanChange | None:
    base_total, base_bounded = bounded_total(before or (), stall_factor)
    cand_total, cand_bounded = bounded_total(after or (), stall_factor)
    change = cand_total - base_total
    if before and after:
        relative = change / base_total if base_total > 0 else None
        if change == 0 or (relative is not None and abs(relative) < min_change):
            return None
        status: Literal["grew", "shrank", "new", "gone"] = "grew" if change > 0 else "shrank"
    elif after:
        status, relative = "new", None
    else:
        status, relative = "gone", (-1.0 if base_total > 0 else None)
    return SpanChange(
        name=name, status=status,
        baseline_count=len(before or ()), baseline_total_us=base_total,
        baseline_p50_us=_percentile(before, 50) if before else None,
        candidate_count=len(after or ()), candidate_total_us=cand_total,
        candidate_p50_us=_percentile(after, 50) if after else None,
        change_us=change, relative_change=relative,
        bounded=base_bounded + cand_bounded, stall_factor=stall_factor,
    )


def _duration(us: float, *, keep_zeros: bool = False) -> str:
    """Three significant digits in µs below 1 ms, else ms: "850 µs", "1.20 ms", "24 ms"."""
    if us == 0:
        return "0"
    value, unit = (us, "µs") if abs(us) < 1000 else (us / 1000, "ms")
    if abs(value) >= 100:
        return f"{value:.0f} {unit}"
    return f"{value:#.3g} {unit}" if keep_zeros else f"{value:.3g} {unit}"


def _spans(count: int) -> str:
    return f"{count} span" if count == 1 else f"{count} spans"


def _calls(count: int) -> str:
    return f"{count} call" if count == 1 else f"{count} calls"
