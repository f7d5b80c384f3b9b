"""The merge gate: may this change merge with no person? Pure: plain data in, checks out.

Fail closed. A change merges without a reviewer only when every check passes; each check
that fails names its reason with the numbers behind it, so the change page can show the gate
the way a pull request shows its checks. The facts are gathered from the database by
reviews.services (change_facts); nothing here reads a row or runs git.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from infraops.feedback.criteria import CRITERION_KEYS, criterion_name
from infraops.manifest import PERFORMANCE_KINDS

RISK_LAYERS = ("numerics", "concurrency", "production")
UNCLASSIFIED = "unclassified"
CONFIRMING_LAYERS = ("e2e", "performance")
# The verdict of an improvement of a candidate that fails an integrity check.
NOT_CREDITED = "not credited"


@dataclass(frozen=True)
class Check:
    """One line of the checks panel. `name` is stable (tests and the page key on it)."""

    name: str
    title: str
    passed: bool
    detail: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class RiskFact:
    category: str
    path: str
    line: int | None
    reason: str


@dataclass(frozen=True)
class CriterionVerdict:
    """A criterion's verdict as the evidence experiment recorded it."""

    criterion_id: int | None
    spec: dict[str, Any]
    passed: bool
    detail: str


@dataclass(frozen=True)
class PerformanceResult:
    """One performance comparison of the evidence experiment (infraops.feedback.findings)."""

    probe: str
    metric: str
    verdict: str  # improved | regressed | no change | inconclusive | not compared | not credited
    title: str
    detail: str
    # What the metric measures (infraops.manifest.KINDS): only time and throughput are speed.
    kind: str = "time"

    @property
    def speed(self) -> bool:
        return self.kind in PERFORMANCE_KINDS


@dataclass(frozen=True)
class ProbeFact:
    name: str
    layer: str
    cost: int


@dataclass(frozen=True)
class EvidenceFacts:
    experiment_id: int
    status: str
    candidate_commit: str
    baseline_commit: str
    probes_run: tuple[str, ...]
    failing: tuple[str, ...]  # titles of failing findings
    integrity: tuple[str, ...]  # titles of integrity findings (any severity)
    criteria: tuple[CriterionVerdict, ...]
    performance: tuple[PerformanceResult, ...]


@dataclass(frozen=True)
class ChangeFacts:
    head_commit: str
    base_commit: str
    branch: str
    branch_tip: str | None  # None: the branch could not be read
    goal_version: int | None  # the pinned version's number
    auto_merge: bool
    criteria: tuple[dict[str, Any], ...]  # the pinned version's criterion specs
    risk: tuple[RiskFact, ...]
    evidence: EvidenceFacts | None
    covering_probes: tuple[ProbeFact, ...] = field(default=())  # perf/e2e probes covering the diff
    manifest_problem: str = ""  # why the manifest could not be read, if it could not


def merge_gate(facts: ChangeFacts) -> list[Check]:
    """Every check, in the order the page shows them. The change may merge without a person
    only if all pass (see gate_passed)."""
    checks = [_auto_merge(facts), _risk(facts), _analysed(facts), _criteria_defined(facts)]
    checks += _criteria(facts)
    checks += [_evidence_head(facts), _feedback_clean(facts), _integrity(facts),
               _end_to_end(facts), _base(facts)]
    return checks


# Checks that ask for a person rather than report bad evidence: automatic merge off, risky
# lines, a file the classifier cannot read. Not passing them means "a reviewer decides", a
# neutral state; counting them as failing made every change in the queue look broken
# (issue 27). Keyed by name, so gates stored before the distinction read the same way.
REVIEWER_DECIDES = frozenset({"auto-merge", "risk", "analysed"})
PASSED, REVIEW, FAILED = "passed", "review", "failed"
# Failing checks that an approval does not "go over": a moved base is re-verified before the
# merge, and a change with no criteria has no measured result to override.
NOT_OVERRIDES = frozenset({"base", "criteria-defined"})


def check_state(check: Mapping[str, Any]) -> str:
    """A stored check's state: passed, review (a reviewer decides) or failed (evidence)."""
    if check.get("passed"):
        return PASSED
    return REVIEW if check.get("name") in REVIEWER_DECIDES else FAILED


def gate_passed(checks: Sequence[Check]) -> bool:
    return bool(checks) and all(check.passed for check in checks)


def only_base_moved(checks: Sequence[Check]) -> bool:
    """Everything passes but the base check: re-verify on the moved base, then merge."""
    failing = [c.name for c in checks if not c.passed]
    return failing == ["base"]


# --- the checks ----------------------------------------------------------------------------

def _version(facts: ChangeFacts) -> str:
    return f"goal v{facts.goal_version}" if facts.goal_version is not None else "no goal version"


def _auto_merge(facts: ChangeFacts) -> Check:
    title = "Automatic merge allowed"
    if facts.goal_version is None:
        return Check("auto-merge", title, False,
                     "the change has no pinned goal version, so nothing allows an automatic merge")
    if not facts.auto_merge:
        return Check("auto-merge", title, False,
                     f"{_version(facts)} does not allow automatic merge (the default): a "
                     "reviewer decides")
    return Check("auto-merge", title, True, f"{_version(facts)} allows automatic merge")


def _risk(facts: ChangeFacts) -> Check:
    risky = [r for r in facts.risk if r.category != UNCLASSIFIED]
    title = "No numerics, concurrency or production risk"
    if not risky:
        return Check("risk", title, True, "the classifier found no risky line")
    parts = []
    for category in RISK_LAYERS:
        found = [r for r in risky if r.category == category]
        if found:
            first = found[0]
            where = f"{first.path}:{first.line}" if first.line is not None else first.path
            parts.append(f"{category}: {len(found)} finding{'s' * (len(found) != 1)} "
                         f"(first {where}: {first.reason})")
    return Check("risk", title, False, "; ".join(parts))


def _analysed(facts: ChangeFacts) -> Check:
    title = "Every changed file analysed"
    unclassified = [r for r in facts.risk if r.category == UNCLASSIFIED]
    if not unclassified:
        return Check("analysed", title, True, "the classifier read every changed file")
    shown = "; ".join(f"{r.path} ({r.reason})" for r in unclassified[:5])
    more = f" and {len(unclassified) - 5} more" if len(unclassified) > 5 else ""
    return Check("analysed", title, False, f"unclassified: {shown}{more}")


def _criteria_defined(facts: ChangeFacts) -> Check:
    title = "Acceptance criteria defined"
    if not facts.criteria:
        return Check("criteria-defined", title, False,
                     f"{_version(facts)} has no acceptance criterion: with nothing to check, "
                     "nothing passes")
    n = len(facts.criteria)
    return Check("criteria-defined", title, True,
                 f"{_version(facts)} has {n} criteri{'a' if n != 1 else 'on'}")


def _same_criterion(pinned: dict[str, Any], measured: dict[str, Any]) -> bool:
    return all(pinned.get(k) == measured.get(k) for k in CRITERION_KEYS)


def _criteria(facts: ChangeFacts) -> list[Check]:
    checks = []
    evidence = facts.evidence
    for spec in facts.criteria:
        name = f"criterion-{spec.get('id')}"
        title = f"Criterion: {criterion_name(spec)}"
        verdict = None
        if evidence is not None:
            verdict = next((v for v in evidence.criteria
                            if v.criterion_id == spec.get("id") and _same_criterion(spec, v.spec)),
                           None)
        if evidence is None:
            checks.append(Check(name, title, False, "not measured: no evidence experiment"))
        elif verdict is None:
            checks.append(Check(name, title, False,
                                f"not measured: experiment {evidence.experiment_id} did not "
                                f"evaluate this criterion as {_version(facts)} states it"))
        elif evidence.candidate_commit != facts.head_commit:
            checks.append(Check(name, title, False,
                                f"measured on {evidence.candidate_commit[:10]}, not on the "
                                f"change's head {facts.head_commit[:10]}"))
        else:
            checks.append(Check(name, title, verdict.passed,
                                f"{verdict.detail} (experiment {evidence.experiment_id}, on "
                                f"{facts.head_commit[:10]})"))
    return checks


def _evidence_head(facts: ChangeFacts) -> Check:
    title = "Evidence measured on this change"
    evidence = facts.evidence
    if evidence is None:
        return Check("evidence", title, False, "no evidence experiment is attached")
    if evidence.status != "succeeded":
        return Check("evidence", title, False,
                     f"experiment {evidence.experiment_id} {evidence.status}, it did not succeed")
    if evidence.candidate_commit != facts.head_commit:
        return Check("evidence", title, False,
                     f"experiment {evidence.experiment_id} measured "
                     f"{evidence.candidate_commit[:10]}, not the change's head "
                     f"{facts.head_commit[:10]}")
    if evidence.baseline_commit != facts.base_commit:
        return Check("evidence", title, False,
                     f"experiment {evidence.experiment_id} compared against "
                     f"{evidence.baseline_commit[:10]}, not the change's base "
                     f"{facts.base_commit[:10]}")
    return Check("evidence", title, True,
                 f"experiment {evidence.experiment_id}: candidate {facts.head_commit[:10]} "
                 f"against base {facts.base_commit[:10]}")


def _feedback_clean(facts: ChangeFacts) -> Check:
    title = "No failing finding"
    evidence = facts.evidence
    if evidence is None:
        return Check("feedback", title, False, "no evidence experiment, so no feedback")
    if evidence.failing:
        shown = "; ".join(evidence.failing[:3])
        more = f" and {len(evidence.failing) - 3} more" if len(evidence.failing) > 3 else ""
        return Check("feedback", title, False,
                     f"{len(evidence.failing)} failing in experiment {evidence.experiment_id}: "
                     f"{shown}{more}")
    return Check("feedback", title, True,
                 f"experiment {evidence.experiment_id} has no failing finding")


def _integrity(facts: ChangeFacts) -> Check:
    title = "No integrity flag"
    evidence = facts.evidence
    if evidence is None:
        return Check("integrity", title, False, "no evidence experiment, so nothing was checked")
    if evidence.integrity:
        return Check("integrity", title, False, "; ".join(evidence.integrity[:3]))
    return Check("integrity", title, True,
                 "outputs and ratios look genuine (no degenerate output, no too-good ratio)")


def _confirming_probe(facts: ChangeFacts) -> ProbeFact | None:
    """The costliest probe covering the changed paths: an e2e one if any, else performance."""
    for layer in CONFIRMING_LAYERS:
        found = [p for p in facts.covering_probes if p.layer == layer]
        if found:
            return max(found, key=lambda p: p.cost)
    return None


def _end_to_end(facts: ChangeFacts) -> Check:
    title = "Gain confirmed end to end"
    evidence = facts.evidence
    if evidence is None:
        return Check("end-to-end", title, False, "no evidence experiment")
    if facts.manifest_problem:
        return Check("end-to-end", title, False,
                     f"the manifest cannot be read ({facts.manifest_problem}), so the probe "
                     "that confirms a gain is unknown")
    # An error that fell (a precision fix) or a count that moved is no gain of speed: only
    # time and throughput claim one, and only they confirm it.
    speed = [r for r in evidence.performance if r.speed]
    cheated = [r for r in speed if r.verdict == NOT_CREDITED]
    if cheated:
        return Check("end-to-end", title, False,
                     f"no gain is credited: {cheated[0].title} comes with an integrity "
                     "failure, so its speed-up is not the change's")
    gains = [r for r in speed if r.verdict == "improved"]
    if not gains:
        return Check("end-to-end", title, True, "no performance gain is claimed")
    confirming = _confirming_probe(facts)
    if confirming is None:
        return Check("end-to-end", title, False,
                     f"{gains[0].title} improved, but no e2e or performance probe of the "
                     "manifest covers the changed paths, so nothing confirms it end to end")
    on_it = [r for r in speed if r.probe == confirming.name]
    what = f"{confirming.name} ({confirming.layer}, cost {confirming.cost})"
    if confirming.name not in evidence.probes_run or not on_it:
        return Check("end-to-end", title, False,
                     f"not confirmed end to end: {gains[0].title} improved, but {what}, the "
                     "costliest probe covering the changed paths, did not report in experiment "
                     f"{evidence.experiment_id}")
    regressed = [r for r in on_it if r.verdict == "regressed"]
    improved = [r for r in on_it if r.verdict == "improved"]
    if regressed:
        return Check("end-to-end", title, False,
                     f"not confirmed end to end: {what} regressed: {regressed[0].detail}")
    if not improved:
        return Check("end-to-end", title, False,
                     f"not confirmed end to end: {gains[0].title} improved ({gains[0].detail}) "
                     f"but {what} shows {on_it[0].verdict}: {on_it[0].detail}")
    return Check("end-to-end", title, True,
                 f"{what} improved on {improved[0].metric}: {improved[0].detail}")


def _base(facts: ChangeFacts) -> Check:
    title = "Base unmoved"
    if facts.branch_tip is None:
        return Check("base", title, False, f"{facts.branch} cannot be read")
    if facts.branch_tip != facts.base_commit:
        return Check("base", title, False,
                     f"{facts.branch} moved from {facts.base_commit[:10]} to "
                     f"{facts.branch_tip[:10]}: the acceptance probes re-run on the merged tree "
                     "before it merges")
    return Check("base", title, True, f"{facts.branch} is still at {facts.base_commit[:10]}")
