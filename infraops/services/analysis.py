"""From an experiment's stored results to its feedback (infraops/feedback.py).

Reads samples, output arrays and traces of one attempt, runs the pure analyses (stats,
correctness, traces, criteria, integrity) and returns plain data for Experiment.feedback.
Output files are hard-linked out of the blob store into a scratch folder: the comparison
code only ever opens regular files it was given.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from django.conf import settings

from infraops import correctness, feedback, stats, traces
from infraops.analysis import CRITERION_KEYS, SampleRow, evaluate_criterion_ci
from infraops.blobs import blob_path
from infraops.feedback import Finding
from infraops.manifest import DEFAULT_ATOL, DEFAULT_RTOL, Manifest, Probe
from infraops.models import Artifact, Experiment, ProbeExecution, Sample, variant_key

TRACE_MAX_BYTES = 64 << 20
TOP_SPANS = 8
MIN_SHARE = 0.01  # spans shorter than this share of the trace are not paired for overlap


def attempt_executions(experiment_id: int, attempt: int) -> list[ProbeExecution]:
    return list(ProbeExecution.objects.filter(experiment_id=experiment_id, attempt=attempt)
                .prefetch_related("artifacts"))


def attempt_samples(executions: Sequence[ProbeExecution]) -> list[SampleRow]:
    """Every sample the executions reported, looked up by execution id: that index stays
    selective, whereas a join on the attempt let stale statistics after a large ingest pick a
    scan of the largest execution's samples (seen: 7 ms per read with 200 000 samples)."""
    rows = Sample.objects.filter(execution_id__in=[e.pk for e in executions]).values_list(
        "execution_id", "probe", "side", "variant", "metric", "value", "unit", "case")
    return [SampleRow(execution=execution, probe=probe, side=side, variant=variant, metric=metric,
                      value=value, unit=unit, case=case)
            for execution, probe, side, variant, metric, value, unit, case in rows.iterator()]


def experiment_feedback(experiment: Experiment, manifest: Manifest,
                        executions: Sequence[ProbeExecution], rows: Sequence[SampleRow]
                        ) -> dict[str, Any]:
    """Analyse one attempt (its executions and their samples, see attempt_executions and
    attempt_samples); the result is JSON-ready (see Feedback.as_dict)."""
    probes = [p for p in manifest.probes if p.name in experiment.probes]
    samples = _per_execution(rows)
    findings: list[Finding] = []
    extras: dict[str, Any] = {"spans": {}, "series": []}
    scratch = Path(tempfile.mkdtemp(prefix="analysis-", dir=_scratch_root()))
    try:
        findings += _performance(probes, samples, seed=experiment.pk)
        extras["distributions"] = _distributions(samples)
        for probe in probes:
            runs = {(e.probe, e.side, e.variant, e.repeat_index): e for e in executions}
            findings += _correctness(probe, runs, scratch, extras, experiment)
            findings += _behaviour(probe, runs, extras)
        findings += _criteria(experiment, samples, probes)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    result = feedback.build(findings).as_dict()
    result.update(extras)
    return result


def _scratch_root() -> Path:
    root = Path(settings.DATA_DIR) / "scratch"
    root.mkdir(parents=True, exist_ok=True)
    return root


SampleKey = tuple[str, str, str, str, str]  # probe, variant, metric, case, side


def _per_execution(rows: Iterable[SampleRow]) -> dict[SampleKey, list[float]]:
    """One value per execution and key: the median of what that execution reported.

    Executions are the independent, interleaved units; samples within one process share its
    state (caches, frequency, placement), so pooling them would understate the noise. Seen
    here: an A/A run pooled 90 per-step samples a side into a 'regression' at p = 3e-6.
    """
    per_execution: dict[tuple[int, SampleKey], list[float]] = defaultdict(list)
    for row in rows:
        key = (row.probe, row.variant, row.metric, row.case, row.side)
        per_execution[(row.execution, key)].append(row.value)
    grouped: dict[SampleKey, list[float]] = defaultdict(list)
    for (_, key), values in per_execution.items():
        grouped[key].append(float(np.median(values)))
    return grouped


def _performance(probes: list[Probe], samples: dict[SampleKey, list[float]], *, seed: int
                 ) -> list[Finding]:
    by_probe = {p.name: p for p in probes}
    found: list[Finding] = []
    keys = sorted({key[:4] for key in samples})
    for probe_name, variant, metric, case in keys:
        probe = by_probe.get(probe_name)
        if probe is None:
            continue
        base = samples.get((probe_name, variant, metric, case, "baseline"), [])
        cand = samples.get((probe_name, variant, metric, case, "candidate"), [])
        if not base or not cand:
            continue
        evidence = {"probe": probe_name, "variant": variant, "metric": metric, "case": case}
        try:
            result = stats.compare(base, cand, direction=probe.direction(metric), seed=seed)
        except ValueError as exc:
            found.append(Finding("performance", "not-comparable", feedback.WARN,
                                 f"{feedback.where(probe_name, variant, case)} {metric}",
                                 f"not compared: {exc}", feedback.METRIC, evidence))
            continue
        found += feedback.performance_findings(probe_name, variant, metric, case, "", result,
                                               evidence)
    return found


def _distributions(samples: dict[SampleKey, list[float]], limit: int = 8
                   ) -> list[dict[str, Any]]:
    """Per compared key, both sides' per-execution values (for the A/B chart)."""
    keys = sorted({key[:4] for key in samples})[:limit]
    return [{"label": " ".join(filter(None, (probe, f"[{variant}]" if variant else "", metric,
                                              case))),
             "baseline": samples.get((probe, variant, metric, case, "baseline"), []),
             "candidate": samples.get((probe, variant, metric, case, "candidate"), [])}
            for probe, variant, metric, case in keys]


# --- correctness -----------------------------------------------------------------------------

def _outputs_dir(execution: ProbeExecution | None, scratch: Path) -> Path | None:
    """A folder holding the execution's outputs/ files, linked out of the blob store."""
    if execution is None:
        return None
    folder = scratch / f"exec-{execution.pk}"
    if folder.exists():
        return folder
    folder.mkdir()
    root = Path(settings.DATA_DIR) / "blobs"
    artifact: Artifact
    for artifact in execution.artifacts.all():
        if not artifact.name.startswith("outputs/") or artifact.name.count("/") != 1:
            continue
        destination = folder / artifact.name.removeprefix("outputs/")
        try:
            os.link(blob_path(root, artifact.sha256), destination)
        except OSError:
            shutil.copyfile(blob_path(root, artifact.sha256), destination)
    return folder


def _correctness(probe: Probe, runs: dict[tuple[str, str, str, int], ProbeExecution],
                 scratch: Path, extras: dict[str, Any], experiment: Experiment
                 ) -> list[Finding]:
    found: list[Finding] = []
    rtol = probe.compare[0].rtol if probe.compare else DEFAULT_RTOL
    atol = probe.compare[0].atol if probe.compare else DEFAULT_ATOL
    for variant in probe.variant_matrix():
        key = variant_key(variant)
        base = runs.get((probe.name, "baseline", key, 0))
        cand = runs.get((probe.name, "candidate", key, 0))
        found += _compare_pair(probe, f"candidate vs baseline [{key or 'default'}]", base, cand,
                               scratch, extras, rtol=rtol, atol=atol, severity=feedback.WARN)
        found += _identical_outputs(probe, key, base, cand, experiment)
    for rule in probe.compare:
        for variant in probe.variant_matrix():
            if any(variant.get(k) != v for k, v in rule.candidate.items()):
                continue
            reference = variant | rule.reference
            for side in ("candidate", "baseline"):
                label = f"[{variant_key(variant)}] vs [{variant_key(reference)}] ({side})"
                found += _compare_pair(
                    probe, label, runs.get((probe.name, side, variant_key(reference), 0)),
                    runs.get((probe.name, side, variant_key(variant), 0)),
                    scratch, extras, rtol=rule.rtol, atol=rule.atol)
    return found


def _compare_pair(probe: Probe, label: str, reference: ProbeExecution | None,
                  candidate: ProbeExecution | None, scratch: Path, extras: dict[str, Any], *,
                  rtol: float, atol: float, severity: str = feedback.FAIL) -> list[Finding]:
    ref_dir, cand_dir = _outputs_dir(reference, scratch), _outputs_dir(candidate, scratch)
    if ref_dir is None or cand_dir is None or not (any(ref_dir.iterdir())
                                                    or any(cand_dir.iterdir())):
        return []
    comparisons = correctness.compare_output_dirs(ref_dir, cand_dir, rtol=rtol, atol=atol)
    evidence = {"probe": probe.name, "compared": label,
                "executions": [e.pk for e in (reference, candidate) if e is not None]}
    found = feedback.correctness_findings(probe.name, label, comparisons, evidence,
                                          severity=severity)
    found += _degenerate_outputs(probe, label, ref_dir, cand_dir, comparisons, evidence)
    if any(c.size is not None for c in comparisons):
        # Absolute error first: relative error is dominated by near-zero reference values.
        series = correctness.error_series(comparisons, metric="max_abs_error")
        relative = correctness.error_series(comparisons, metric="max_rel_error")
        if relative.growing and not series.growing:
            series = relative
        extras["series"].append({"probe": probe.name, "label": label, **series.as_dict()})
        # A growing error that still fits the tolerance everywhere is a warning to watch.
        within = all(c.ok for c in comparisons)
        finding = feedback.series_finding(probe.name, label, series, evidence,
                                          severity=feedback.WARN if within else severity)
        if finding is not None:
            found.append(finding)
    return found


def _degenerate_outputs(probe: Probe, label: str, ref_dir: Path, cand_dir: Path,
                        comparisons: list[correctness.CaseComparison],
                        evidence: dict[str, Any]) -> list[Finding]:
    """All-zero or constant candidate arrays against a reference that varies."""
    found = []
    for c in comparisons:
        if c.status in ("missing-reference", "missing-candidate", "unreadable"):
            continue
        ref, cand = ref_dir / f"{c.case}.npy", cand_dir / f"{c.case}.npy"
        if not (ref.is_file() and cand.is_file()):
            continue
        try:
            ref_array = correctness.load_output(ref, max_bytes=256 << 20)
            cand_array = correctness.load_output(cand, max_bytes=256 << 20)
        except ValueError:
            continue
        if not (isinstance(ref_array, np.ndarray) and isinstance(cand_array, np.ndarray)):
            continue
        if cand_array.size > 1 and ref_array.size > 1 and _constant(cand_array) \
                and not _constant(ref_array):
            what = "all zero" if not np.any(cand_array) else "constant"
            found.append(Finding(
                "integrity", "degenerate-output", feedback.FAIL,
                f"{probe.name} {label} case {c.case} output is {what}",
                f"the candidate's {cand_array.size} values are {what} while the reference "
                "varies: the computation was probably skipped", feedback.CASE,
                evidence | {"case": c.case}))
    return found


def _constant(array: np.ndarray[Any, Any]) -> bool:
    flat = array.reshape(-1)
    return bool(np.all(flat == flat[0]))


def _identical_outputs(probe: Probe, variant: str, base: ProbeExecution | None,
                       cand: ProbeExecution | None, experiment: Experiment) -> list[Finding]:
    """Bit-identical outputs although the change touches what the probe covers."""
    if base is None or cand is None or not probe.covers_any(experiment.changed_paths):
        return []
    outputs = [{(a.name, a.sha256) for a in e.artifacts.all() if a.name.startswith("outputs/")}
               for e in (base, cand)]
    if not outputs[0] or outputs[0] != outputs[1]:
        return []
    return [Finding(
        "integrity", "identical-outputs", feedback.WARN,
        f"{feedback.where(probe.name, variant)} outputs are bit-identical to the baseline",
        f"the change touches paths this probe covers ({', '.join(experiment.changed_paths[:3])}"
        f") yet all {len(outputs[1])} outputs are byte for byte the same: the changed code may "
        "not be exercised", feedback.PROBE, {"probe": probe.name, "variant": variant})]


# --- behaviour -------------------------------------------------------------------------------

def _trace(execution: ProbeExecution | None) -> traces.Trace | None:
    if execution is None:
        return None
    artifact = next((a for a in execution.artifacts.all() if a.name == "trace.json"), None)
    if artifact is None or artifact.size > TRACE_MAX_BYTES:
        return None
    path = blob_path(Path(settings.DATA_DIR) / "blobs", artifact.sha256)
    try:
        return traces.parse_trace(path.read_bytes())
    except traces.TraceError:
        return None


def _behaviour(probe: Probe, runs: dict[tuple[str, str, str, int], ProbeExecution],
               extras: dict[str, Any]) -> list[Finding]:
    found: list[Finding] = []
    for variant in probe.variant_matrix():
        key = variant_key(variant)
        base_exec = runs.get((probe.name, "baseline", key, 0))
        cand_exec = runs.get((probe.name, "candidate", key, 0))
        candidate, baseline = _trace(cand_exec), _trace(base_exec)
        for side, trace, execution in (("candidate", candidate, cand_exec),
                                       ("baseline", baseline, base_exec)):
            if trace is None or execution is None:
                continue
            rows = traces.span_stats(trace)
            label = f"{key or 'default'}, {side}"
            extras["spans"][f"{probe.name} [{label}]"] = [r.as_dict() for r in rows[:20]]
            found += _overlaps(probe, label, trace, rows, {
                "probe": probe.name, "variant": key, "side": side,
                "execution": execution.pk, "artifact": "trace.json"})
        if candidate is not None and baseline is not None and cand_exec is not None:
            evidence = {"probe": probe.name, "variant": key, "execution": cand_exec.pk,
                        "artifact": "trace.json"}
            for change in traces.trace_diff(baseline, candidate, min_change=0.10)[:5]:
                found.append(feedback.span_change_finding(probe.name, key, change, evidence))
    return found


def _overlaps(probe: Probe, variant: str, trace: traces.Trace,
              rows: list[traces.SpanStats], evidence: dict[str, Any]) -> list[Finding]:
    """Pairs of substantial spans on different threads that never run at the same time."""
    span = max(trace.end_us - trace.start_us, 1.0)
    totals: dict[str, float] = defaultdict(float)
    threads: dict[str, set[str]] = defaultdict(set)
    for row in rows:
        totals[row.name] += row.total_us
        threads[row.name].add(row.thread)
    names = [n for n in sorted(totals, key=totals.__getitem__, reverse=True)
             if totals[n] / span >= MIN_SHARE][:TOP_SPANS]
    found = []
    for a in names:
        for b in names:
            if a == b or threads[a] & threads[b]:
                continue
            result = traces.overlap(trace, a, b)
            finding = feedback.overlap_finding(probe.name, variant, result, evidence)
            if finding is not None and totals[a] <= totals[b]:
                found.append(_with_idle(finding, trace, a, b, threads[a], threads[b]))
    return found


def _with_idle(finding: Finding, trace: traces.Trace, a: str, b: str, a_threads: set[str],
               b_threads: set[str]) -> Finding:
    """Add how long a's thread sat idle while b held the work: the blocked-thread evidence."""
    if len(a_threads) != 1:
        return finding
    (thread,) = a_threads
    try:
        idle = traces.idle_intervals(trace, thread)
    except ValueError:
        return finding
    b_spans = [(sp.start_us, sp.end_us) for sp in trace.spans if sp.name == b]
    b_total = sum(end - start for start, end in b_spans)
    idle_during = sum(max(0.0, min(i.end_us, end) - max(i.start_us, start))
                      for i in idle for start, end in b_spans)
    if b_total <= 0:
        return finding
    holders = ", ".join(sorted(b_threads))
    extra = (f"; thread {thread} sat idle for {idle_during / b_total:.0%} of the time {holders} "
             f"ran {b} ({idle_during / 1000:.1f} of {b_total / 1000:.1f} ms): it was blocked "
             "while the other thread held the work")
    return Finding(finding.layer, finding.kind, finding.severity, finding.title,
                   finding.detail + extra, finding.specificity,
                   finding.evidence | {"idle_during_us": idle_during, "held_us": b_total})


# --- criteria --------------------------------------------------------------------------------

def _criteria(experiment: Experiment, samples: dict[SampleKey, list[float]],
              probes: list[Probe]) -> list[Finding]:
    found = []
    for spec in experiment.criteria:
        def values(variant: str, side: str, spec: dict[str, Any] = spec) -> list[float]:
            return [v for (probe, var, metric, _case, s), vals in samples.items()
                    if probe == spec["probe"] and metric == spec["metric"] and s == side
                    and variant in ("", var) for v in vals]

        verdict = evaluate_criterion_ci(spec, values, seed=experiment.pk)
        found.append(Finding(
            "criteria", "criterion", feedback.PASS if verdict.passed else feedback.FAIL,
            verdict.criterion, verdict.detail, feedback.METRIC,
            {"probe": spec["probe"], "metric": spec["metric"], "criterion": spec.get("id"),
             # The criterion as measured: the merge gate matches it to the pinned version's.
             "spec": {k: spec.get(k) for k in CRITERION_KEYS},
             "verdict": verdict.as_dict()}))
    return found
