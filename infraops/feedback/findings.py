"""The feedback object: findings from every layer, most specific first, each with its evidence.
Pure: no Django. Built by infraops/experiments/analysis.py from an experiment's stored results.

A finding is local (it names the probe, variant, case, span or metric it is about), carries
the numbers that establish it, and points at the raw evidence (executions, artifacts). What
ran (the execution status) is worded apart from what the results say (the verdict). The agent
reads `agent_text()`, bounded to AGENT_TEXT_LIMIT characters and ending with next steps
derived from the findings; a human reads the page.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from infraops.feedback.correctness import CaseComparison, ErrorSeries, natural_key
from infraops.feedback.numbers import significant
from infraops.feedback.stats import INCONCLUSIVE, Comparison
from infraops.feedback.traces import Overlap, SpanChange

AGENT_TEXT_LIMIT = 4000
MAX_NEXT_STEPS = 6
NEXT_STEPS_BUDGET = 1200  # characters of agent_text kept for the next steps

FAIL, WARN, INFO, PASS = "fail", "warn", "info", "pass"
SEVERITY_ORDER = {FAIL: 0, WARN: 1, INFO: 2, PASS: 3}

# Specificity: an element of a case beats a case, which beats a span or a metric.
ELEMENT, CASE, SERIES, SPAN, METRIC, PROBE = 50, 40, 35, 30, 20, 10

NEVER_OVERLAP = 0.05


@dataclass(frozen=True)
class Finding:
    layer: str  # execution | correctness | integrity | behaviour | performance | criteria
    kind: str
    severity: str
    title: str
    detail: str
    specificity: int
    evidence: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Feedback:
    findings: tuple[Finding, ...]
    execution: dict[str, Any] = field(default_factory=dict)  # what ran: see execution_text
    next_steps: tuple[str, ...] = ()

    @property
    def counts(self) -> dict[str, int]:
        result = dict.fromkeys(SEVERITY_ORDER, 0)
        for finding in self.findings:
            result[finding.severity] += 1
        return result

    @property
    def verdict(self) -> str:
        """What the results say, in words ('2 failing, 1 warning'), apart from what ran."""
        counts = self.counts
        if counts[FAIL]:
            return f"{counts[FAIL]} failing, {counts[WARN]} warnings"
        if counts[WARN]:
            return f"no failures, {counts[WARN]} warnings"
        return "no failures, no warnings" if self.findings else "nothing to judge"

    def as_dict(self) -> dict[str, Any]:
        return {"counts": self.counts, "verdict": self.verdict, "execution": self.execution,
                "findings": [f.as_dict() for f in self.findings],
                "next_steps": list(self.next_steps), "agent_text": self.agent_text()}

    def agent_text(self, limit: int = AGENT_TEXT_LIMIT) -> str:
        """At most `limit` characters: what ran, the verdict, failures and warnings first,
        most specific first (the rest is counted, never silently dropped), then next steps."""
        counts = self.counts
        lines = []
        if self.execution.get("text"):
            lines.append(f"Execution: {self.execution['text']}.")
        lines.append(f"Verdict: {self.verdict} ({counts[FAIL]} failing, {counts[WARN]} "
                     f"warnings, {counts[INFO]} notes, {counts[PASS]} passing).")
        steps = ["Next steps:"] if self.next_steps else []
        for number, step in enumerate(self.next_steps, 1):
            line = f"{number}. {step}"[:400]
            if sum(len(s) + 1 for s in steps) + len(line) > NEXT_STEPS_BUDGET:
                break
            steps.append(line)
        tail_text = "\n".join(steps)
        budget = limit - len(tail_text) - 1
        used = sum(len(line) + 1 for line in lines)
        for shown, finding in enumerate(self.findings):
            line = _cut(f"[{finding.severity.upper()} {finding.layer}] {finding.title}: "
                        f"{finding.detail}", keep_end=finding.kind == "probe-failed")
            rest = len(self.findings) - shown
            more = f"({rest} more findings on the experiment page)"
            if used + len(line) + 1 + len(more) + 1 > budget:
                lines.append(more)
                break
            lines.append(line)
            used += len(line) + 1
        if tail_text:
            lines.append(tail_text)
        return "\n".join(lines)[:limit]


LINE_LIMIT = 900
CRASH_LINE_LIMIT = 1900  # a crash's stderr tail (at most 1500 characters) is kept whole


def _cut(line: str, *, keep_end: bool) -> str:
    """One finding's line within its limit; a crash keeps its end (the error is last)."""
    limit = CRASH_LINE_LIMIT if keep_end else LINE_LIMIT
    if len(line) <= limit:
        return line
    if keep_end:
        return line[:300] + " [...] " + line[-(limit - 307):]
    return line[:limit]


def build(findings: Iterable[Finding], *, execution: dict[str, Any] | None = None,
          next_probes: Sequence[tuple[str, int, str]] = ()) -> Feedback:
    ordered = tuple(sorted(findings, key=lambda f: (SEVERITY_ORDER[f.severity],
                                                    -f.specificity)))
    return Feedback(ordered, execution or {}, tuple(next_steps(ordered, next_probes)))


def next_steps(findings: Sequence[Finding], next_probes: Sequence[tuple[str, int, str]] = (),
               *, limit: int = MAX_NEXT_STEPS) -> list[str]:
    """What to do next, derived from the findings (ordered as `build` orders them): the crash
    to read, the case and index to look at first (one per compared pair), the variant pair to
    compare, the repeats that would decide, the probe to run next (its slot is kept).
    Deduplicated; at most `limit`."""
    steps: list[str] = []
    pairs: set[tuple[str, str]] = set()
    worst = _worst_cases(findings)

    def add(step: str) -> None:
        if step not in steps:
            steps.append(step)

    for f in findings:
        e = f.evidence
        if f.severity not in (FAIL, WARN) and f.kind != "perf-comparison":
            continue
        if f.kind == "probe-failed":
            add(f"read the stderr of {e.get('probe')} {e.get('side')} "
                f"[{e.get('variant') or 'default'}] above (reason {e.get('reason')}) and make "
                "it run; nothing else of that probe can be trusted until it does")
        elif f.layer in ("correctness", "integrity") and e.get("case"):
            pair = (str(e.get("probe")), str(e.get("compared", "")))
            if pair in pairs:
                continue
            pairs.add(pair)
            e = worst.get(pair, f).evidence
            comparison = e.get("comparison") or {}
            index = comparison.get("first_mismatch")
            at = f" at index {list(index)}" if index else ""
            seed = e.get("seed") or (e.get("seeds") or [None])[0]
            again = f" (INFRAOPS_SEED={seed} reproduces it)" if seed is not None else ""
            of = " ".join(part for part in pair if part)
            add(f"read case {e['case']} of {of} first{at}{again}")
            variants = [v for v in e.get("variants", []) if v]
            if len(set(variants)) == 2:
                add(f"compare variants [{variants[1]}] and [{variants[0]}] of "
                    f"{e.get('probe')} case by case: they must agree")
        elif f.kind == "perf-comparison":
            c = e.get("comparison") or {}
            if c.get("verdict") == INCONCLUSIVE and c.get("repeats_needed"):
                add(f"decide {e.get('probe')} {e.get('metric')}"
                    + (f" [{e['variant']}]" if e.get("variant") else "")
                    + f": {c.get('advice') or str(c['repeats_needed']) + ' repeats a side'}")
        elif f.kind == "no-overlap":
            add(f"look at why {f.title.split(' ', 1)[-1]}: read the spans on each thread "
                "in trace.json")
        elif f.layer == "criteria":
            add(f"{f.title}: work on {e.get('probe')} {e.get('metric')} until its interval "
                "meets the bound")
    probes = [f"run probe {name} next (cost {cost}): {why}" for name, cost, why in next_probes[:1]]
    return steps[:limit - len(probes)] + probes


def about_baseline(evidence: Mapping[str, Any]) -> bool:
    """Whether a finding (its evidence) is about the baseline side, context for the
    candidate."""
    return evidence.get("side") == "baseline" or str(evidence.get("compared", "")).endswith(
        "(baseline)")


def uncredited(findings: Sequence[Finding]) -> list[Finding]:
    """A candidate that fails an integrity check is credited no improvement: each improved
    comparison becomes a warning saying why, its evidence marked ``credited: False`` (the
    merge gate and the goal's progress read it). A cheat's speed-up is the cheat's effect."""
    cheats = [f for f in findings
              if f.layer == "integrity" and f.severity == FAIL and not about_baseline(f.evidence)]
    if not cheats:
        return list(findings)
    why = (f"not credited: the candidate fails {len(cheats)} integrity "
           f"check{'s' * (len(cheats) != 1)} (first: {cheats[0].title})")
    result = []
    for f in findings:
        if f.kind == "perf-comparison" and f.severity == PASS:
            f = Finding(f.layer, f.kind, WARN, f"{f.title.rsplit(' ', 1)[0]} not credited",
                        f"{why}. {f.detail}", f.specificity, f.evidence | {"credited": False})
        result.append(f)
    return result


MAX_CASES_NAMED = 6


def by_root_cause(findings: Sequence[Finding]) -> list[Finding]:
    """One finding per probe, compared pair and kind of failure, in place of one per case: a
    precision loss that fails every length of a merge is one cause, and ten findings of it
    (3.1k characters) buried the rest. The merged finding lists its cases worst first (the
    largest error, absolute then relative; then by name) in its title, gives the worst case's
    detail whole and the others' errors after it; its evidence keeps the worst case's `case`
    and `comparison` (what next_steps reads) and every case in `cases`, with each one's
    comparison in `comparisons`. A failing error-versus-size series of a pair whose cases
    fail is how their error grows: it is folded into that pair's first failing correctness
    finding (its detail and evidence `series`), not a second failure. Findings about no case
    keep their place; a group takes its first member's."""
    groups: dict[tuple[str, ...], list[Finding]] = {}
    order: list[tuple[str, ...] | Finding] = []
    for f in findings:
        key = _cause(f)
        if key is None:
            order.append(f)
        else:
            if key not in groups:
                order.append(key)
            groups.setdefault(key, []).append(f)
    growth = {_pair_of(f): f for f in findings
              if f.kind == "error-vs-size" and f.severity == FAIL}
    folded: list[Finding] = []
    result: list[Finding] = []
    for item in order:
        if isinstance(item, Finding):
            result.append(item)
            continue
        merged = _merged(groups[item])
        series = growth.get(_pair_of(merged))
        if (series is not None and merged.layer == "correctness" and merged.severity == FAIL
                and all(series is not f for f in folded)):
            folded.append(series)
            merged = Finding(merged.layer, merged.kind, merged.severity, merged.title,
                             f"{merged.detail}; {series.detail}", merged.specificity,
                             merged.evidence | {"series": series.evidence.get("series")})
        result.append(merged)
    return [f for f in result if all(f is not series for series in folded)]


def _cause(f: Finding) -> tuple[str, ...] | None:
    """What a failing or warned finding about one case of a compared pair has in common with
    the others of its cause; None for any other finding."""
    if (f.layer not in ("correctness", "integrity") or f.severity not in (FAIL, WARN)
            or not f.evidence.get("case")):
        return None
    return (f.layer, f.kind, f.severity, *_pair_of(f))


def _pair_of(f: Finding) -> tuple[str, str]:
    return str(f.evidence.get("probe", "")), str(f.evidence.get("compared", ""))


def _merged(group: list[Finding]) -> Finding:
    if len(group) == 1:
        return group[0]
    ordered = sorted(group, key=lambda f: (*(-e for e in _errors(f)),
                                           natural_key(str(f.evidence["case"]))))
    worst = ordered[0]
    cases = [str(f.evidence["case"]) for f in ordered]
    more = len(cases) - MAX_CASES_NAMED
    others = [_case_clause(f) for f in ordered[1:MAX_CASES_NAMED]]
    also = (f"; also {len(ordered) - 1} more case{'s' * (len(ordered) > 2)}, worst first: "
            f"{', '.join(others)}" + (f" and {more} more" if more > 0 else ""))
    comparisons = {str(f.evidence["case"]): f.evidence["comparison"] for f in ordered
                   if isinstance(f.evidence.get("comparison"), dict)}
    return Finding(worst.layer, worst.kind, worst.severity,
                   worst.title.replace(f" case {cases[0]}", f" cases {_shown(cases)}", 1),
                   worst.detail + also, max(f.specificity for f in group),
                   worst.evidence | {"cases": cases, "comparisons": comparisons})


def _shown(cases: Sequence[str]) -> str:
    more = len(cases) - MAX_CASES_NAMED
    return ", ".join(cases[:MAX_CASES_NAMED]) + (f" and {more} more" if more > 0 else "")


def case_titles(finding: Mapping[str, Any]) -> list[str]:
    """The title of each case a finding (as stored) is about, as a finding of that case alone
    would have it: one per cause stands for several (by_root_cause)."""
    title = str(finding.get("title", ""))
    evidence = finding.get("evidence") or {}
    cases = evidence.get("cases")
    if not isinstance(evidence.get("case"), str) or not isinstance(cases, list) or len(
            cases) < 2:
        return [title]
    return [title.replace(f" cases {_shown(cases)}", f" case {case}", 1) for case in cases]


def _errors(f: Finding) -> tuple[float, float]:
    """A case finding's largest error, absolute then relative (0 when it has none)."""
    c = f.evidence.get("comparison") or {}
    return _error(c.get("max_abs_error")), _error(c.get("max_rel_error"))


def _error(value: object) -> float:
    if value == "inf":  # CaseComparison.as_dict spells a non-finite error as text
        return math.inf
    return _number(value)


def _case_clause(f: Finding) -> str:
    case = str(f.evidence["case"])
    c = f.evidence.get("comparison") or {}
    numbers = [f"max abs {significant(v)}" for v in [c.get("max_abs_error")]
               if isinstance(v, int | float)]
    if c.get("mismatches"):
        numbers.append(f"{c['mismatches']} elements differ")
    return f"{case} ({', '.join(numbers)})" if numbers else case


def _worst_cases(findings: Sequence[Finding]) -> dict[tuple[str, str], Finding]:
    """Per compared pair (probe, what was compared), its failing or warned case with the
    largest error (absolute, then relative): the case to read first."""
    def error(f: Finding) -> tuple[float, float]:
        c = f.evidence.get("comparison") or {}
        return (_number(c.get("max_abs_error")), _number(c.get("max_rel_error")))

    worst: dict[tuple[str, str], Finding] = {}
    for f in findings:
        if (f.severity not in (FAIL, WARN) or f.layer not in ("correctness", "integrity")
                or not f.evidence.get("case")):
            continue
        pair = (str(f.evidence.get("probe")), str(f.evidence.get("compared", "")))
        if pair not in worst or error(f) > error(worst[pair]):
            worst[pair] = f
    return worst


def _number(value: object) -> float:
    return float(value) if isinstance(value, int | float) and not math.isnan(value) else 0.0


def where(probe: str, variant: str = "", case: str = "") -> str:
    parts = [probe]
    if variant:
        parts.append(f"[{variant}]")
    if case:
        parts.append(f"case {case}")
    return " ".join(parts)


# How a verdict reads per metric kind (infraops.manifest.KINDS): severity and the word of the
# title. Only time and throughput are speed: their regressions fail and only their
# improvements can be implausible. An error that falls is a fix and one that rises is a
# warning (a criterion bounds it); counts (registers, spills) and ratios are facts of the
# run, which moved, neither good nor bad in themselves.
_KIND_VERDICTS: dict[str, dict[str, tuple[str, str]]] = {
    "time": {"improved": (PASS, "improved"), "regressed": (FAIL, "regressed")},
    "throughput": {"improved": (PASS, "improved"), "regressed": (FAIL, "regressed")},
    "memory": {"improved": (PASS, "improved"), "regressed": (WARN, "regressed")},
    "error": {"improved": (PASS, "fell"), "regressed": (WARN, "grew")},
    "count": {"improved": (INFO, "changed"), "regressed": (INFO, "changed")},
    "ratio": {"improved": (INFO, "changed"), "regressed": (INFO, "changed")},
}
SPEED_KINDS = ("time", "throughput")


def performance_findings(probe: str, variant: str, metric: str, case: str, unit: str,
                         comparison: Comparison, evidence: dict[str, Any], *,
                         plausible: float = 5.0, kind: str = "time") -> list[Finding]:
    """One finding per compared metric, explaining its verdict as its `kind` reads it (see
    _KIND_VERDICTS; the kind is in the evidence); a speed-up beyond `plausible` (a factor) of
    a time or throughput adds a failing integrity one."""
    c = comparison
    numbers = (f"median {c.baseline_median:.4g} -> {c.candidate_median:.4g} {unit}".strip()
               + f", ratio {significant(c.ratio)} (95% CI {significant(c.ci_low)}-"
               f"{significant(c.ci_high)}), "
               f"p={c.p_value:.2g}, n={c.n_baseline}/{c.n_candidate} executions a side, "
               f"noise CV {max(c.cv_baseline, c.cv_candidate):.1%}, detectable effect "
               f"{c.mde:.1%}") + (f"; {c.sequence}" if c.sequence else "")
    if c.verdict == INCONCLUSIVE:
        why = f"inconclusive because {c.reason.split('; minimal detectable')[0]}"
        detail = f"{why}; {c.advice}. {numbers}" if c.advice else f"{why}. {numbers}"
    elif c.verdict == "no change":
        detail = f"no change: {c.reason}. {numbers}"
    else:
        detail = f"{c.verdict}: {c.reason}. {numbers}"
    judged = _KIND_VERDICTS.get(kind, _KIND_VERDICTS["time"])
    severity, word = judged.get(c.verdict, (INFO if c.verdict == "no change" else WARN,
                                            c.verdict))
    title = f"{where(probe, variant, case)} {metric} {word}"
    if kind not in SPEED_KINDS and c.verdict in judged:
        detail = f"{detail} (a{'n' * (kind[0] in 'aeiou')} {kind}, not a speed)"
    found = [Finding("performance", "perf-comparison", severity, title, detail,
                     CASE if case else METRIC,
                     evidence | {"comparison": c.as_dict(), "kind": kind})]
    # Only an improvement of speed can be implausible; a metric that fell to zero (a count)
    # has no factor to judge. It fails only where the interval's end nearest no change is
    # beyond the bound too: a real 3.5x on a loaded machine (noise CV 33%) measured 5.6x, with
    # an interval down to 2.1x, and a cheat that stops doing the work is beyond it whole.
    speedup = _speedup(c, c.ratio)
    if (kind in SPEED_KINDS and c.verdict == "improved" and c.ratio > 0
            and math.isfinite(speedup) and speedup > plausible):
        nearest = _speedup(c, c.ci_high if c.direction == "minimize" else c.ci_low)
        at_least = nearest if math.isfinite(nearest) and nearest > 0 else speedup
        name = f"{where(probe, variant, case)} {metric} {speedup:.3g}x better"
        if at_least > plausible:
            found.append(Finding(
                "integrity", "too-good-to-be-true", FAIL, f"{name}: implausible",
                f"beyond the plausibility bound of {plausible:g}x (at least {at_least:.3g}x "
                "with 95% confidence): such a change usually means the probe stopped doing "
                "the work; check its outputs (or raise the probe's plausible_speedup if it "
                "is real)", CASE if case else METRIC,
                evidence | {"speedup": speedup, "at_least": at_least, "bound": plausible}))
        else:
            found.append(Finding(
                "integrity", "beyond-the-bound-within-noise", WARN,
                f"{name}: beyond the plausibility bound, within the noise",
                f"the median is beyond the plausibility bound of {plausible:g}x, but the "
                f"interval reaches down to {at_least:.3g}x (noise CV "
                f"{max(c.cv_baseline, c.cv_candidate):.0%}): not judged implausible; more "
                "repeats on a quieter machine would tell, and the outputs say whether the "
                "work was done", CASE if case else METRIC,
                evidence | {"speedup": speedup, "at_least": at_least, "bound": plausible}))
    return found


def _speedup(c: Comparison, ratio: float) -> float:
    """The speed-up a ratio (candidate / baseline) of `c`'s metric means: its inverse for a
    metric to minimize (a time), itself for one to maximize (a throughput)."""
    if c.direction == "minimize":
        return 1 / ratio if ratio > 0 else math.inf
    return ratio


def correctness_findings(probe: str, label: str, comparisons: Sequence[CaseComparison],
                         evidence: dict[str, Any], *, severity: str = FAIL) -> list[Finding]:
    """label says what was compared, e.g. 'candidate vs baseline [cp=on]' or
    '[cp=on] vs [cp=off] (candidate)'. A broken equivalence between variants fails; a
    candidate whose outputs differ from the baseline's is a warning (a fix changes them too)."""
    found = []
    for c in comparisons:
        if c.ok:
            continue
        specificity = ELEMENT if c.first_mismatch is not None else CASE
        found.append(Finding("correctness", f"output-{c.status}", severity,
                             f"{probe} {label} case {c.case} {c.status}", c.detail, specificity,
                             evidence | {"case": c.case, "comparison": c.as_dict()}))
    matched = sum(1 for c in comparisons if c.ok)
    if comparisons and matched == len(comparisons):
        found.append(Finding("correctness", "outputs-match", PASS, f"{probe} {label}",
                             f"all {matched} cases match within tolerance", PROBE, evidence))
    return found


def series_finding(probe: str, label: str, series: ErrorSeries, evidence: dict[str, Any], *,
                   severity: str = FAIL, note: str = "") -> Finding | None:
    """A growing error is reported at `severity`; a flat one is a note. `note`: a clause
    added to the detail (how it stands against the tolerance)."""
    if len(series.points) < 2:
        return None
    severity = severity if series.growing else INFO
    detail = f"{series.detail}; {note}" if note else series.detail
    return Finding("correctness", "error-vs-size", severity,
                   f"{probe} {label} error versus size", detail, SERIES,
                   evidence | {"series": series.as_dict()})


def overlap_finding(probe: str, variant: str, result: Overlap, evidence: dict[str, Any], *,
                    by_side: dict[str, Overlap] | None = None,
                    attribution: dict[str, Any] | None = None,
                    notes: Sequence[str] = ()) -> Finding | None:
    """A pair of span sets that never overlap (under NEVER_OVERLAP), else None. `by_side`: the
    same pair's overlap on each side's trace ("overlap 0.0% on the baseline, 61% on the
    candidate"); `attribution`: `traces.Attribution.as_dict()` of the first set's idle time;
    `notes`: more clauses for the detail. All of it goes into the detail and the evidence."""
    if not never_overlaps(result):
        return None
    a, b = "|".join(result.a), "|".join(result.b)
    title = f"{where(probe, variant)} {a} never overlaps {b}"
    parts = [result.detail]
    extra: dict[str, Any] = {"overlap": result.as_dict()}
    if by_side and len(by_side) > 1:
        parts.append(overlap_sides(by_side))
        extra["overlap_by_side"] = {side: r.as_dict() for side, r in by_side.items()}
    parts += notes
    if attribution is not None:
        parts.append(str(attribution.get("detail", "")))
        extra["attribution"] = attribution
    return Finding("behaviour", "no-overlap", WARN, title, "; ".join(p for p in parts if p),
                   SPAN, evidence | extra)


def span_change_finding(probe: str, variant: str, change: SpanChange,
                        evidence: dict[str, Any], *,
                        attribution: dict[str, Any] | None = None,
                        paired: dict[str, Overlap] | None = None) -> Finding:
    """A span that grew, shrank, appeared or went. `attribution`: `traces.Attribution.as_dict()`
    of its idle time on the candidate's trace, worded in the detail when that idle time is at
    least 5% of the span's own candidate time (always in the evidence); `paired`: its overlap,
    per side, with the span that ran most during that idle time, worded with it."""
    severity = WARN if change.status in ("grew", "new") else INFO
    detail = change.detail + f"; count {change.baseline_count} -> {change.candidate_count}"
    extra: dict[str, Any] = {"span": change.name, "change": change.as_dict()}
    material = True
    if attribution is not None:
        extra["attribution"] = attribution
        idle = attribution.get("idle_us") or 0.0
        material = idle > 0 and idle >= 0.05 * change.candidate_total_us
        if material:
            detail += f"; on the candidate, {attribution.get('detail', '')}"
    if paired and len(paired) > 1:
        extra["overlap_by_side"] = {side: r.as_dict() for side, r in paired.items()}
        if material:
            first = next(iter(paired.values()))
            detail += "; " + overlap_sides(
                paired, f"{'|'.join(first.a)} overlapped {'|'.join(first.b)}")
    return Finding("behaviour", f"span-{change.status}", severity,
                   f"{where(probe, variant)} span {change.name} {change.status}",
                   detail, SPAN, evidence | extra)


def never_overlaps(result: Overlap) -> bool:
    """Whether the first set takes time and the second covers under NEVER_OVERLAP of it."""
    return result.fraction is not None and result.fraction < NEVER_OVERLAP


def overlap_sides(by_side: dict[str, Overlap], subject: str = "overlap") -> str:
    """One pair's overlap on each side, in the order given: 'overlap 0.0% on the baseline, 61%
    on the candidate'; a side where the first set is missing or takes no time says so."""
    parts = []
    for side, result in by_side.items():
        a, b = "|".join(result.a), "|".join(result.b)
        if result.fraction is None:
            why = f"no {a} spans" if result.a_spans == 0 else f"{a} takes no time"
            parts.append(f"none on the {side} ({why})")
            continue
        share = f"{result.fraction:.1%}" if result.fraction < 0.1 else f"{result.fraction:.0%}"
        missing = f" (no {b} spans)" if result.b_spans == 0 else ""
        parts.append(f"{share} on the {side}{missing}")
    return f"{subject} {', '.join(parts)}"
