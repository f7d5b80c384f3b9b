"""The facts the merge gate judges, read from the database and git (reviews.gate is pure)."""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

from infraops import gitops
from infraops.feedback.findings import about_baseline
from infraops.models import Experiment
from reviews import gate
from reviews.models import Change


def evidence_facts(experiment: Experiment) -> gate.EvidenceFacts:
    """What the gate needs of an experiment's feedback. Findings about the baseline side
    (a failure the change fixes, say) are not held against the candidate."""
    findings = [f for f in experiment.feedback.get("findings", [])
                if not about_baseline(f.get("evidence") or {})]
    # A cheat is credited no gain, in feedback stored before the analysis said so too.
    cheat = any(f["layer"] == "integrity" and f["severity"] == "fail" for f in findings)
    return gate.EvidenceFacts(
        experiment_id=experiment.pk, status=experiment.status,
        candidate_commit=experiment.candidate_commit, baseline_commit=experiment.baseline_commit,
        probes_run=tuple(experiment.probes),
        failing=tuple(f["title"] for f in findings if f["severity"] == "fail"),
        # A failing integrity finding flags the change; a warning (a speed-up beyond the
        # bound only within the noise) is shown with the findings, not judged a cheat.
        integrity=tuple(f"{f['title']}: {f['detail']}" for f in findings
                        if f["layer"] == "integrity" and f["severity"] == "fail"),
        criteria=tuple(_verdict(f) for f in findings if f["layer"] == "criteria"),
        performance=tuple(_performance(f, cheat=cheat) for f in findings
                          if f["kind"] == "perf-comparison"),
    )


def _verdict(finding: dict[str, Any]) -> gate.CriterionVerdict:
    evidence = finding.get("evidence") or {}
    return gate.CriterionVerdict(
        criterion_id=evidence.get("criterion"), spec=evidence.get("spec") or {},
        passed=finding["severity"] == "pass", detail=finding["detail"])


def _performance(finding: dict[str, Any], *, cheat: bool) -> gate.PerformanceResult:
    evidence = finding.get("evidence") or {}
    verdict = (evidence.get("comparison") or {}).get("verdict", "not compared")
    if verdict == "improved" and (cheat or evidence.get("credited") is False):
        verdict = gate.NOT_CREDITED
    # Findings stored before metrics had kinds judged every metric as a time.
    return gate.PerformanceResult(probe=evidence.get("probe", ""),
                                  metric=evidence.get("metric", ""), verdict=verdict,
                                  title=finding["title"], detail=finding["detail"],
                                  kind=str(evidence.get("kind") or "time"))


def change_facts(change: Change, *, head: str | None = None, base: str | None = None,
                 experiment: Experiment | None = None) -> gate.ChangeFacts:
    """The facts of `change` (or of its merged tree: head/base/experiment given, when the
    base moved and the acceptance probes re-ran on the merge)."""
    target = change.target
    head = head or change.head_commit
    base = base or change.base_commit
    experiment = experiment if experiment is not None else change.experiment
    try:
        tip: str | None = gitops.branch_tip(target.clone_path, target.base_branch)
    except gitops.GitError:
        tip = None
    version = change.goal_version
    spec: dict[str, Any] = version.spec if version is not None else {}
    covering, problem = _covering_probes(change)
    return gate.ChangeFacts(
        head_commit=head, base_commit=base, branch=target.base_branch, branch_tip=tip,
        goal_version=version.number if version is not None else None,
        auto_merge=bool(spec.get("auto_merge", False)),
        criteria=tuple(spec.get("criteria", [])),
        risk=tuple(gate.RiskFact(r["category"], r["path"], r.get("line"), r["reason"])
                   for r in change.risk),
        evidence=evidence_facts(experiment) if experiment is not None else None,
        covering_probes=covering, manifest_problem=problem,
    )


def _covering_probes(change: Change) -> tuple[tuple[gate.ProbeFact, ...], str]:
    manifest = change.target.manifest()
    if manifest is None:
        return (), "; ".join(change.target.manifest_errors) or "no infraops.toml was read"
    try:
        paths = changed_paths(str(change.target.clone_path), change.base_commit,
                              change.head_commit)
    except gitops.GitError as exc:
        return (), f"the changed paths cannot be listed: {exc}"
    return tuple(gate.ProbeFact(p.name, p.layer, p.cost) for p in manifest.probes
                 if p.layer in gate.CONFIRMING_LAYERS and p.covers_any(paths)), ""


FULL_SHA = re.compile(r"[0-9a-f]{40}")


def changed_paths(repo: str, base: str, head: str) -> tuple[str, ...]:
    """gitops.changed_paths, remembered per process when both ends are full commit shas: what
    two commits differ in never changes. An open change's page evaluates its gate on every
    read (change_gate_read), and the three git processes this took were most of that."""
    if FULL_SHA.fullmatch(base) and FULL_SHA.fullmatch(head):
        return _changed_paths_between_commits(repo, base, head)
    return tuple(gitops.changed_paths(Path(repo), base, head))


@functools.lru_cache(maxsize=4096)
def _changed_paths_between_commits(repo: str, base: str, head: str) -> tuple[str, ...]:
    # A GitError (a commit the clone lacks) is raised, not remembered: lru_cache keeps only
    # what returns.
    return tuple(gitops.changed_paths(Path(repo), base, head))
