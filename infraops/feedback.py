"""The feedback object: findings from every layer, most specific first, each with its evidence.
Pure: no Django. Built by infraops/services/analysis.py from an experiment's stored results.

A finding is local (it names the probe, variant, case, span or metric it is about), carries
the numbers that establish it, and points at the raw evidence (executions, artifacts). The
agent reads `agent_text()`, bounded to AGENT_TEXT_LIMIT characters; a human reads the page.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from infraops.correctness import CaseComparison, ErrorSeries
from infraops.stats import Comparison
from infraops.traces import Overlap, SpanChange

AGENT_TEXT_LIMIT = 4000

FAIL, WARN, INFO, PASS = "fail", "warn", "info", "pass"
SEVERITY_ORDER = {FAIL: 0, WARN: 1, INFO: 2, PASS: 3}

# Specificity: an element of a case beats a case, which beats a span or a metric.
ELEMENT, CASE, SERIES, SPAN, METRIC, PROBE = 50, 40, 35, 30, 20, 10

# A ratio beyond these is flagged: an 80% speed-up from a config change is usually a probe
# that stopped doing the work.
TOO_GOOD_RATIO = 0.2
NEVER_OVERLAP = 0.05


@dataclass(frozen=True)
class Finding:
    layer: str  # correctness | behaviour | performance | criteria | integrity
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

    @property
    def counts(self) -> dict[str, int]:
        result = dict.fromkeys(SEVERITY_ORDER, 0)
        for finding in self.findings:
            result[finding.severity] += 1
        return result

    def as_dict(self) -> dict[str, Any]:
        return {"counts": self.counts, "findings": [f.as_dict() for f in self.findings],
                "agent_text": self.agent_text()}

    def agent_text(self, limit: int = AGENT_TEXT_LIMIT) -> str:
        """At most `limit` characters: failures and warnings first, most specific first; the
        rest is counted, never silently dropped."""
        counts = self.counts
        head = (f"Feedback: {counts[FAIL]} failing, {counts[WARN]} warnings, "
                f"{counts[INFO]} notes, {counts[PASS]} passing.")
        lines = [head]
        used = len(head)
        for shown, finding in enumerate(self.findings):
            line = f"[{finding.severity.upper()} {finding.layer}] {finding.title}: {finding.detail}"
            line = line[:600]
            rest = len(self.findings) - shown
            tail = f"({rest} more findings on the experiment page)"
            if used + len(line) + 1 + len(tail) + 1 > limit:
                lines.append(tail)
                break
            lines.append(line)
            used += len(line) + 1
        return "\n".join(lines)[:limit]


def build(findings: Iterable[Finding]) -> Feedback:
    ordered = sorted(findings, key=lambda f: (SEVERITY_ORDER[f.severity], -f.specificity))
    return Feedback(tuple(ordered))


def where(probe: str, variant: str = "", case: str = "") -> str:
    parts = [probe]
    if variant:
        parts.append(f"[{variant}]")
    if case:
        parts.append(f"case {case}")
    return " ".join(parts)


def performance_findings(probe: str, variant: str, metric: str, case: str, unit: str,
                         comparison: Comparison, evidence: dict[str, Any]) -> list[Finding]:
    """One finding per compared metric; a too-good-to-be-true ratio adds an integrity one."""
    c = comparison
    speed = (f"median {c.baseline_median:.4g} -> {c.candidate_median:.4g} {unit}".strip()
             + f", ratio {c.ratio:.3f} (95% CI {c.ci_low:.3f}-{c.ci_high:.3f}), "
             f"p={c.p_value:.2g}, n={c.n_baseline}/{c.n_candidate}, "
             f"noise CV {max(c.cv_baseline, c.cv_candidate):.1%}, detectable effect {c.mde:.1%}")
    severity = {"regressed": FAIL, "improved": PASS, "no change": INFO}.get(c.verdict, WARN)
    title = f"{where(probe, variant, case)} {metric} {c.verdict}"
    found = [Finding("performance", "perf-comparison", severity, title, speed,
                     CASE if case else METRIC, evidence | {"comparison": c.as_dict()})]
    if c.ratio < TOO_GOOD_RATIO or c.ratio > 1 / TOO_GOOD_RATIO:
        found.append(Finding(
            "integrity", "too-good-to-be-true", WARN,
            f"{where(probe, variant, case)} {metric} changed {c.ratio:.2f}x",
            "a change this large usually means the probe stopped doing the work: check its "
            "outputs before believing it", CASE if case else METRIC, evidence))
    return found


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
                   severity: str = FAIL) -> Finding | None:
    """A growing error is reported at `severity`; a flat one is a note."""
    if len(series.points) < 2:
        return None
    severity = severity if series.growing else INFO
    return Finding("correctness", "error-vs-size", severity,
                   f"{probe} {label} error versus size", series.detail, SERIES,
                   evidence | {"series": series.as_dict()})


def overlap_finding(probe: str, variant: str, result: Overlap,
                    evidence: dict[str, Any]) -> Finding | None:
    if result.fraction is None or result.fraction >= NEVER_OVERLAP:
        return None
    a, b = "|".join(result.a), "|".join(result.b)
    title = f"{where(probe, variant)} {a} never overlaps {b}"
    return Finding("behaviour", "no-overlap", WARN, title, result.detail, SPAN,
                   evidence | {"overlap": result.as_dict()})


def span_change_finding(probe: str, variant: str, change: SpanChange,
                        evidence: dict[str, Any]) -> Finding:
    severity = WARN if change.status in ("grew", "new") else INFO
    counts = f"; count {change.baseline_count} -> {change.candidate_count}"
    return Finding("behaviour", f"span-{change.status}", severity,
                   f"{where(probe, variant)} span {change.name} {change.status}",
                   change.detail + counts,
                   SPAN, evidence | {"span": change.name, "change": change.as_dict()})
