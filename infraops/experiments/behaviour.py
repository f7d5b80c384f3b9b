"""The behaviour layer of an experiment's feedback: its traces, span by span and thread by
thread (infraops/feedback/traces.py), as findings (infraops/feedback/findings.py).

`behaviour_findings` reads each side's stored trace.json; `overlap_findings` and
`change_findings` are the pure part, on parsed traces:

- a pair of substantial spans on different threads that never overlap, with the same pair's
  overlap on the other side's trace ("overlap 0.0% on the baseline, 61% on the candidate"),
  how long the smaller span's thread sat idle while the other span ran, and which spans on
  other threads ran during that idle time, by name and share (`traces.idle_attribution`);
- a span that grew or is new against the baseline's trace, with the attribution of its idle
  time on the candidate's trace and its overlap, per side, with the span that ran most then.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from infraops.experiments.blobstore import blob_store
from infraops.feedback import findings as feedback
from infraops.feedback import traces
from infraops.feedback.findings import Finding
from infraops.manifest import Probe
from infraops.models import ProbeExecution, variant_key

TRACE_MAX_BYTES = 64 << 20
TOP_SPANS = 8
MIN_SHARE = 0.01  # spans shorter than this share of the trace are not paired for overlap
TOP_CHANGES = 5
PAIR_SHARE = 0.10  # a span that ran this share of a grown span's idle time is paired with it
# A never-overlapping pair is told from its smaller span's thread unless that thread sat idle
# for less than this share of the other span's time and the other thread did for more.
WAITED_SHARE = 0.10
SIDES = ("baseline", "candidate")
MIN_CHANGE = 0.10  # a span whose total changed less than this is not reported
# A call over this many times its span's median call in the same trace counts at that bound in
# the span's total (traces.bounded_total): a stall or a cold first call is not a change.
STALL_FACTOR = 10.0
MAX_REPEAT_TRACES = 6  # traces a side read to confirm a span change
MAX_TIMELINES = 4  # per-thread timelines an experiment's feedback keeps for its page

Runs = dict[tuple[str, str, str, int], ProbeExecution]  # (probe, side, variant, repeat)


def _trace(execution: ProbeExecution | None) -> traces.Trace | None:
    if execution is None:
        return None
    artifact = next((a for a in execution.artifacts.all() if a.name == "trace.json"), None)
    if artifact is None or artifact.size > TRACE_MAX_BYTES:
        return None
    try:
        with blob_store().open(artifact.sha256) as handle:
            return traces.parse_trace(handle.read())
    except (traces.TraceError, OSError):
        return None


def behaviour_findings(probe: Probe, runs: Runs, extras: dict[str, Any]) -> list[Finding]:
    """Per variant: each side's spans (into extras["spans"]), never-overlapping pairs with the
    blocked-thread evidence and the other side's overlap, and the spans that changed from the
    baseline's trace. Both read every repeat's trace (the first MAX_REPEAT_TRACES), so that
    one trace a loaded machine stalled neither makes a finding nor hides one."""
    found: list[Finding] = []
    count = min(max(probe.repeat, 1), MAX_REPEAT_TRACES)
    for variant in probe.variant_matrix():
        key = variant_key(variant)
        per_repeat = {side: [_trace(runs.get((probe.name, side, key, repeat)))
                             for repeat in range(count)] for side in SIDES}
        repeats = {side: [t for t in per_repeat[side] if t is not None] for side in SIDES}
        for side in ("candidate", "baseline"):
            trace, execution = per_repeat[side][0], runs.get((probe.name, side, key, 0))
            if trace is None or execution is None:
                continue
            rows = traces.span_stats(trace)
            label = f"{key or 'default'}, {side}"
            extras["spans"][f"{probe.name} [{label}]"] = [r.as_dict() for r in rows[:20]]
            timelines = extras.setdefault("timelines", {})
            if len(timelines) < MAX_TIMELINES:
                timelines[f"{probe.name} [{label}]"] = traces.timeline(trace)
            other = per_repeat["baseline" if side == "candidate" else "candidate"][0]
            found += overlap_findings(probe.name, label, trace, {
                "probe": probe.name, "variant": key, "side": side,
                "execution": execution.pk, "artifact": "trace.json"},
                side=side, other=other, rows=rows, repeats=repeats)
        found += _span_changes(probe, key, runs, per_repeat)
    return found


def _span_changes(probe: Probe, key: str, runs: Runs,
                  per_repeat: dict[str, list[traces.Trace | None]]) -> list[Finding]:
    """The spans that changed between the sides' traces. Each pair of repeats (`per_repeat`:
    each side's traces by repeat, None where one is missing) is compared, and a span is
    reported from the first pair that shows its change, if the change holds between the
    medians of every repeat's total: a call stalled in one trace neither makes a change nor
    hides one (a loaded machine once hid a span that shrank 75% because its first candidate
    trace had stalled)."""
    pairs: list[tuple[traces.Trace, traces.Trace, ProbeExecution]] = []
    for repeat, (base, cand) in enumerate(zip(*(per_repeat[side] for side in SIDES),
                                              strict=True)):
        execution = runs.get((probe.name, "candidate", key, repeat))
        if base is not None and cand is not None and execution is not None:
            pairs.append((base, cand, execution))
    repeats = {"baseline": [pair[0] for pair in pairs], "candidate": [pair[1] for pair in pairs]}
    found: list[Finding] = []
    reported: set[object] = set()
    for baseline, candidate, execution in pairs:
        for finding in change_findings(probe.name, key, baseline, candidate, {
                "probe": probe.name, "variant": key, "execution": execution.pk,
                "artifact": "trace.json"}):
            span = finding.evidence.get("span")
            if span not in reported and _holds_across_repeats(finding, repeats):
                reported.add(span)
                found.append(finding)
    return found[:TOP_CHANGES]


def _holds_across_repeats(finding: Finding, repeats: dict[str, list[traces.Trace]]) -> bool:
    """A span change seen between the first traces must hold between the medians of every
    repeat's (bounded) total for that span: one stalled trace is not a change."""
    name = finding.evidence.get("span")
    if name is None or min(len(repeats["baseline"]), len(repeats["candidate"])) < 2:
        return True
    base, cand = (statistics.median(_span_total(t, str(name)) for t in repeats[side])
                  for side in SIDES)
    status = finding.kind.removeprefix("span-")
    if status == "grew":
        return cand > base * (1 + MIN_CHANGE)
    if status == "shrank":
        return cand < base * (1 - MIN_CHANGE)
    return True


def _span_total(trace: traces.Trace, name: str) -> float:
    durations = [span.end_us - span.start_us for span in trace.spans if span.name == name]
    return traces.bounded_total(durations, STALL_FACTOR)[0]


def overlap_findings(probe: str, variant: str, trace: traces.Trace, evidence: dict[str, Any],
                     *, side: str = "", other: traces.Trace | None = None,
                     rows: list[traces.SpanStats] | None = None,
                     repeats: Mapping[str, Sequence[traces.Trace]] | None = None,
                     ) -> list[Finding]:
    """Pairs of substantial spans (the TOP_SPANS longest in total, each at least MIN_SHARE of
    the trace) on different threads that never run at the same time, each reported once: the
    pair is judged with the smaller span first (its overlap is the stricter) and told from its
    thread ("thread mooncake sat idle for 60% of the time main ran dispatch"), unless that
    thread hardly waited (under WAITED_SHARE of the other's time) and the other one did: then
    from the other's. A transfer stretched by a loaded machine past dispatch's total would
    otherwise turn the pair round into "main sat idle for 0%". `side` ("baseline" or
    "candidate") is the side of `trace`; `other`, the other side's trace, gives the pair's
    overlap there too. `repeats`: each side's traces of every repeat (the first being `trace`
    and `other`); where a side has several, its overlap is their median's (one a loaded
    machine stalled mid-span overlapped 16% on a commit whose other traces overlapped 0%)."""
    repeats = repeats or {}
    mine = list(repeats.get(side) or [trace])
    theirs = list(repeats.get(_other_side(side)) or ([other] if other is not None else []))
    rows = traces.span_stats(trace) if rows is None else rows
    span = max(trace.end_us - trace.start_us, 1.0)
    totals: dict[str, float] = defaultdict(float)
    threads: dict[str, set[str]] = defaultdict(set)
    for row in rows:
        totals[row.name] += row.total_us
        threads[row.name].add(row.thread)
    names = [n for n in sorted(totals, key=lambda n: (-totals[n], n))
             if totals[n] / span >= MIN_SHARE][:TOP_SPANS]
    attributions = _Attributions(trace)
    found = []
    for a in names:
        for b in names:
            if (totals[a], a) >= (totals[b], b) or threads[a] & threads[b]:
                continue  # each pair once, the smaller span first: its overlap is the stricter
            result = _median_overlap(mine, a, b)
            if not feedback.never_overlaps(result):
                continue
            first, then = a, b
            note, held = _held(trace, a, b, threads[a], threads[b])
            turned_note, turned = _held(trace, b, a, threads[b], threads[a])
            if _idle_share(held) < WAITED_SHARE <= _idle_share(turned):
                first, then, note, held = b, a, turned_note, turned
                result = _median_overlap(mine, b, a)
            by_side = _by_side(side, result, theirs, first, then)
            notes = [note] if note else []
            if max(len(mine), len(theirs)) > 1:
                counts = {side: len(mine), _other_side(side): len(theirs)}
                notes.append("each overlap is the median of " + " and ".join(
                    f"{counts[s]} {s} traces" for s in SIDES if by_side or s == side))
            finding = feedback.overlap_finding(
                probe, variant, result, evidence | held, by_side=by_side,
                attribution=attributions.get(first), notes=notes)
            if finding is not None:
                found.append(finding)
    return found


def change_findings(probe: str, variant: str, baseline: traces.Trace, candidate: traces.Trace,
                    evidence: dict[str, Any]) -> list[Finding]:
    """The TOP_CHANGES spans whose total time changed by 10% or more (each call counted at most
    STALL_FACTOR times its span's median call); one that grew or is new carries the
    attribution of its idle time on the candidate's trace and, when some span on another
    thread ran for PAIR_SHARE or more of that idle time, the pair's overlap per side."""
    found = []
    attributions = _Attributions(candidate)
    for change in traces.trace_diff(baseline, candidate, min_change=MIN_CHANGE,
                                    stall_factor=STALL_FACTOR)[:TOP_CHANGES]:
        attribution = paired = None
        if change.status in ("grew", "new"):
            attribution = attributions.get(change.name)
            top = attributions.top(change.name)
            if top is not None:
                paired = {side: traces.overlap(trace, change.name, top)
                          for side, trace in zip(SIDES, (baseline, candidate), strict=True)}
        found.append(feedback.span_change_finding(probe, variant, change, evidence,
                                                  attribution=attribution, paired=paired))
    return found


class _Attributions:
    """`traces.idle_attribution` per span name of one trace, each computed once."""

    def __init__(self, trace: traces.Trace) -> None:
        self.trace = trace
        self.done: dict[str, traces.Attribution | None] = {}

    def result(self, name: str) -> traces.Attribution | None:
        if name not in self.done:
            self.done[name] = traces.idle_attribution(self.trace, name)
        return self.done[name]

    def get(self, name: str) -> dict[str, Any] | None:
        result = self.result(name)
        return result.as_dict() if result is not None else None

    def top(self, name: str) -> str | None:
        """The span, not a wait and not `name` itself on another thread (a span is no
        partner of its own), that ran longest on another thread while `name`'s thread sat
        idle, if it ran for at least PAIR_SHARE of that time."""
        result = self.result(name)
        if result is None:
            return None
        share = next((o for o in result.others if not o.waiting and o.name != name), None)
        return share.name if share is not None and share.share >= PAIR_SHARE else None


def _other_side(side: str) -> str:
    return "baseline" if side == "candidate" else "candidate"


def _median_overlap(trace_list: Sequence[traces.Trace], a: str, b: str) -> traces.Overlap:
    """The pair's overlap on the trace whose fraction is the median of `trace_list` (the lower
    of the middle two for an even count): one trace's measured result, not a mix. Traces where
    `a` takes no time count only when every trace is so."""
    results = [traces.overlap(trace, a, b) for trace in trace_list]
    known = sorted((r for r in results if r.fraction is not None),
                   key=lambda r: r.fraction or 0.0)
    return known[(len(known) - 1) // 2] if known else results[0]


def _by_side(side: str, result: traces.Overlap, others: Sequence[traces.Trace], a: str,
             b: str) -> dict[str, traces.Overlap] | None:
    """The pair's overlap on both sides, baseline first, when the other side has traces."""
    if not others or side not in SIDES:
        return None
    mirrored = _median_overlap(others, a, b)
    return {s: result if s == side else mirrored for s in SIDES}


def _held(trace: traces.Trace, a: str, b: str, a_threads: set[str],
          b_threads: set[str]) -> tuple[str, dict[str, Any]]:
    """How long a's thread sat idle while b ran: the blocked-thread evidence (a note for the
    detail and evidence keys), or nothing when a runs on several threads or b takes no time."""
    if len(a_threads) != 1:
        return "", {}
    (thread,) = a_threads
    try:
        idle = traces.idle_intervals(trace, thread)
    except ValueError:
        return "", {}
    held = _merge([(s.start_us, s.end_us) for s in trace.spans if s.name == b])
    held_us = sum(end - start for start, end in held)
    if held_us <= 0:
        return "", {}
    idle_during = _common([(i.start_us, i.end_us) for i in idle], held)
    holders = ", ".join(sorted(b_threads))
    note = (f"thread {thread} sat idle for {idle_during / held_us:.0%} of the time {holders} "
            f"ran {b} ({idle_during / 1000:.1f} of {held_us / 1000:.1f} ms)")
    return note, {"idle_during_us": idle_during, "held_us": held_us}


def _idle_share(held: dict[str, Any]) -> float:
    """The share of the other span's time that the first span's thread sat idle (0 without
    the evidence)."""
    return float(held["idle_during_us"]) / float(held["held_us"]) if held else 0.0


def _merge(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


def _common(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """The time two sorted, disjoint interval lists share."""
    total = 0.0
    i = j = 0
    while i < len(a) and j < len(b):
        total += max(0.0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total
