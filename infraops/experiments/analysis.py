"""The experiment's feedback service: from an attempt's stored results to its findings
(infraops/feedback/findings.py), stored in Experiment.feedback.

Reads samples, output files and traces of one attempt and runs the pure analyses: execution
(what ran, what crashed and why), performance (infraops/feedback/stats.py), correctness
(infraops/feedback/correctness.py), integrity (outputs that are degenerate, do not follow the
seed or match only under one; implausible speed-ups), behaviour
(infraops/experiments/behaviour.py) and criteria (infraops/feedback/criteria.py). The findings
are framed candidate against baseline: what
the baseline already got wrong is context, and a baseline failure the candidate no longer has
is one "fixed" finding. Output files are hard-linked out of the blob store into a scratch
folder: the comparison code only ever opens regular files it was given.
"""

from __future__ import annotations

import difflib
import math
import os
import shutil
import tempfile
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from django.conf import settings

from infraops.experiments.behaviour import Runs, behaviour_findings
from infraops.experiments.blobstore import blob_store
from infraops.feedback import correctness, stats
from infraops.feedback import findings as feedback
from infraops.feedback.correctness import CaseComparison, natural_key
from infraops.feedback.criteria import (
    CRITERION_KEYS,
    IntervalVerdict,
    criterion_cells,
    criterion_name,
    evaluate_criterion_ci,
)
from infraops.feedback.findings import Finding
from infraops.feedback.samples import SampleKey, SampleRow, per_execution
from infraops.manifest import (
    DEFAULT_ATOL,
    DEFAULT_RTOL,
    PERFORMANCE_KINDS,
    Manifest,
    Metric,
    Probe,
)
from infraops.models import Artifact, Experiment, ProbeExecution, Sample, variant_key

STDERR_TAIL_CHARS = 1500
STDERR_TAIL_LINES = 25
OUTPUT_MAX_BYTES = 256 << 20


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


def _label_sizes(executions: Sequence[ProbeExecution]) -> dict[int, dict[str, float]]:
    """Per execution, case -> size from the `size` label of its metrics."""
    pairs: dict[int, list[tuple[str, dict[str, Any]]]] = defaultdict(list)
    labelled = Sample.objects.filter(execution_id__in=[e.pk for e in executions],
                                     labels__has_key="size").exclude(case="")
    for execution, case, labels in labelled.values_list("execution_id", "case", "labels")[:100_000]:
        pairs[execution].append((case, labels))
    return {execution: correctness.sizes_from_labels(rows) for execution, rows in pairs.items()}


@dataclass
class _Context:
    """One attempt's analysis: what every layer reads and where it puts its charts."""

    experiment: Experiment
    manifest: Manifest
    probes: list[Probe]
    runs: Runs  # (probe, side, variant, repeat) -> execution; repeat -1 is the seed check
    scratch: Path
    sizes: dict[int, dict[str, float]]
    extras: dict[str, Any] = field(default_factory=lambda: {"spans": {}, "series": []})
    # (reference, candidate, rtol, atol) -> comparisons: the baseline's rule pairs are read
    # for what it gets wrong and again for their findings.
    compared: dict[tuple[int, int, float, float], list[CaseComparison] | None] = field(
        default_factory=dict)


def experiment_feedback(experiment: Experiment, manifest: Manifest,
                        executions: Sequence[ProbeExecution], rows: Sequence[SampleRow], *,
                        left_behind: dict[str, list[str]] | None = None) -> dict[str, Any]:
    """Analyse one attempt (its executions and their samples, see attempt_executions and
    attempt_samples; `left_behind`: per side, files its executions left in the checkout); the
    result is JSON-ready (see Feedback.as_dict)."""
    probes = [p for p in manifest.probes if p.name in experiment.probes]
    samples = per_execution(rows)
    findings: list[Finding] = []
    scratch = Path(tempfile.mkdtemp(prefix="analysis-", dir=_scratch_root()))
    context = _Context(experiment, manifest, probes,
                       {(e.probe, e.side, e.variant, e.repeat_index): e for e in executions},
                       scratch, _label_sizes(executions))
    try:
        findings += _executions(executions)
        findings += _left_behind(left_behind or {})
        findings += _metric_names(probes, rows, executions)
        findings += _performance(probes, samples, seed=experiment.pk,
                                 margin=_Margin(experiment.margin, experiment.margin_metric))
        # A sample's own unit, else the one its metric's kind or name gives (decode_us: us).
        declared = {p.name: p for p in probes}
        units = {(r.probe, r.variant, r.metric, r.case): declared[r.probe].metric(r.metric).unit
                 for r in rows if r.probe in declared}
        units |= {(r.probe, r.variant, r.metric, r.case): r.unit for r in rows if r.unit}
        context.extras["distributions"] = _distributions(samples, units)
        context.extras["series"] += _error_curves(probes, rows, context.sizes)
        for probe in probes:
            findings += _correctness(context, probe)
            findings += behaviour_findings(probe, context.runs, context.extras)
        findings += _criteria(experiment, samples)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    built = feedback.build(feedback.uncredited(feedback.by_root_cause(findings)),
                           execution=_execution_status(experiment, executions),
                           next_probes=_next_probes(experiment, manifest, executions))
    result = built.as_dict()
    result.update(context.extras)
    return result


def _scratch_root() -> Path:
    root = Path(settings.DATA_DIR) / "scratch"
    root.mkdir(parents=True, exist_ok=True)
    return root


# --- execution -------------------------------------------------------------------------------

def _execution_status(experiment: Experiment, executions: Sequence[ProbeExecution]
                      ) -> dict[str, Any]:
    """What ran, worded apart from what the results say."""
    failed = [e for e in executions if e.reason != "ok"]
    warmups = sum(1 for e in executions if e.is_warmup)
    ran = {e.probe for e in executions}
    not_run = [p for p in experiment.probes if p not in ran]
    if failed:
        text = (f"{len(failed)} of {len(executions)} probe executions failed"
                + (f"; not run: {', '.join(not_run)}" if not_run else ""))
    elif not_run:
        text = f"{len(executions)} probe executions ran; not run: {', '.join(not_run)}"
    else:
        text = f"all probes ran: {len(executions)} executions, exit 0"
    if warmups:
        text += f" ({warmups} warm-ups, not samples)"
    return {"ok": not failed and not not_run, "executions": len(executions),
            "failed": len(failed), "warmups": warmups, "not_run": not_run, "text": text}


def _executions(executions: Sequence[ProbeExecution]) -> list[Finding]:
    """One failing finding per execution that did not exit 0: status, reason, stderr tail."""
    found = []
    for execution in executions:
        if execution.reason == "ok":
            continue
        which = "warm-up" if execution.is_warmup else f"#{execution.repeat_index}"
        where = (f"{execution.probe} {execution.side} [{execution.variant or 'default'}] "
                 f"{which}")
        status = (f"exit status {execution.exit_code}" if execution.exit_code is not None
                  else "no exit status")
        tail = stderr_tail(execution.stderr)
        detail = f"{status}, reason {execution.reason}"
        if execution.detail:
            detail += f": {execution.detail.splitlines()[0][:300]}"
        detail += (f"; the last lines of its stderr:\n{tail}" if tail
                   else "; it wrote nothing to stderr")
        found.append(Finding(
            "execution", "probe-failed", feedback.FAIL, f"{where} failed ({status})", detail,
            feedback.PROBE,
            {"probe": execution.probe, "side": execution.side, "variant": execution.variant,
             "execution": execution.pk, "exit_code": execution.exit_code,
             "reason": execution.reason, "seed": execution.seed}))
    return found


def _left_behind(left: dict[str, list[str]]) -> list[Finding]:
    """The candidate left files in its checkout that the baseline did not: the next execution
    (a later repeat, the samples after the warm-up) can replay them instead of working."""
    baseline = set(left.get("baseline", []))
    extra = [path for path in left.get("candidate", []) if path not in baseline]
    if not extra:
        return []
    shown = ", ".join(extra[:5]) + (f" and {len(extra) - 5} more" if len(extra) > 5 else "")
    return [Finding(
        "integrity", "left-behind", feedback.FAIL,
        f"the candidate left {len(extra)} files in its checkout between executions",
        f"{shown}: files the commit does not hold and the baseline's executions did not leave; "
        "later executions can replay them (a cache of results) instead of doing the work. "
        "Write scratch files under $INFRAOPS_OUT or /tmp", feedback.PROBE,
        {"side": "candidate", "files": extra[:50]})]


def _metric_names(probes: Sequence[Probe], rows: Sequence[SampleRow],
                  executions: Sequence[ProbeExecution]) -> list[Finding]:
    """Per probe that ran, the metrics it declares against those it wrote: a declared one
    never written (a goal on it is never measured) or a written one not declared, named with
    the closest name of the other list (`wrk_ms` declared, `work_ms` written). A probe that
    declares none (a correctness probe) claims nothing."""
    written: dict[str, set[str]] = defaultdict(set)
    for row in rows:
        written[row.probe].add(row.metric)
    ran = {e.probe for e in executions if e.reason == "ok" and not e.is_warmup}
    found = []
    for probe in probes:
        declared = set(probe.metrics)
        if probe.name not in ran or not declared:
            continue
        missing = sorted(declared - written[probe.name])
        unknown = sorted(written[probe.name] - declared)
        if not missing and not unknown:
            continue
        parts = [f"declared {name} is never written{_closest(name, unknown, 'written')}"
                 for name in missing]
        parts += [f"written {name} is not declared{_closest(name, missing, 'declared')}"
                  for name in unknown]
        found.append(Finding(
            "execution", "metric-names", feedback.WARN,
            f"{probe.name} writes other metrics than it declares",
            "; ".join(parts[:10]) + (f" and {len(parts) - 10} more" if len(parts) > 10 else "")
            + ": a goal or criterion on a declared metric that is never written is never "
            "measured; make the names in infraops.toml and the probe agree",
            feedback.PROBE,
            {"probe": probe.name, "missing": missing[:50], "undeclared": unknown[:50]}))
    return found


def _closest(name: str, options: Sequence[str], which: str) -> str:
    close = difflib.get_close_matches(name, options, n=1, cutoff=0.6)
    return f" (closest {which}: {close[0]})" if close else ""


def stderr_tail(text: str, *, lines: int = STDERR_TAIL_LINES, chars: int = STDERR_TAIL_CHARS
                ) -> str:
    """The end of a probe's stderr, at most `lines` lines and `chars` characters."""
    tail = "\n".join(text.rstrip().splitlines()[-lines:])
    return tail if len(tail) <= chars else "..." + tail[-chars:]


def _next_probes(experiment: Experiment, manifest: Manifest,
                 executions: Sequence[ProbeExecution]) -> list[tuple[str, int, str]]:
    """Probes worth running next, cheapest first: (name, cost, why)."""
    ran = {e.probe for e in executions}
    chosen = [p for p in manifest.probes if p.name in experiment.probes and p.name not in ran]
    result = [(p.name, p.cost, "chosen for this change but not run: a cheaper probe failed")
              for p in chosen]
    covering = [p for p in manifest.probes
                if p.name not in experiment.probes and p.covers_any(experiment.changed_paths)]
    result += [(p.name, p.cost, f"covers the change ({p.layer}) and has not run on it")
               for p in sorted(covering, key=lambda p: p.cost)]
    return result


# --- performance -----------------------------------------------------------------------------

@dataclass(frozen=True)
class _Margin:
    """The goal's smallest meaningful effect is the margin of the goal's own metric; every
    other metric keeps the margin its manifest entry states, else the default, so a goal that
    only cares about 20% never hides a 15% regression elsewhere."""

    value: float
    metric: str  # "probe.metric"; blank: every metric

    def of(self, probe: str, metric: str, declared: float | None = None) -> float:
        """`declared`: the margin the manifest states for this metric, if any."""
        if self.metric == f"{probe}.{metric}":
            return self.value
        if declared is not None:
            return declared
        if not self.metric:
            return self.value
        return min(self.value, stats.DEFAULT_NO_CHANGE_MARGIN)


def sample_plan(probe: Probe) -> tuple[int, ...]:
    """Samples a side at each look of the probe's comparisons: its repeats, then its
    extra_repeats in stages (feedback.stats.looks)."""
    return stats.looks(probe.repeat, probe.extra_repeats)


@dataclass(frozen=True)
class LookState:
    """What a variant's samples so far ask of the runner (infraops.experiments.services)."""

    first_run_outlier: bool  # a judged series' first execution is left out: run one more
    more_would_decide: bool  # an inconclusive comparison that the next look may decide


def look_state(experiment: Experiment, probe: Probe, variant: str,
               rows: Sequence[SampleRow]) -> LookState:
    """After a look's repeats of one variant (`rows`: the attempt's samples so far), whether
    another repeat (a first-run outlier to replace) or the next look's repeats (an undecided
    comparison of a time or throughput they may decide) are worth running: the comparisons
    the feedback will make. An experiment asked a question (its goal's metric, its criteria)
    spends repeats only on the comparisons that answer it: the others are reported as the
    planned repeats leave them, since a look of a GPU probe costs minutes and no verdict of
    the gate reads them."""
    plan = sample_plan(probe)
    samples = per_execution(r for r in rows if r.probe == probe.name and r.variant == variant)
    seed, margin = experiment.pk, _Margin(experiment.margin, experiment.margin_metric)
    asked = asked_metrics(experiment)
    outlier = more = False
    for key, base, cand, measured in _judged(probe, samples):
        if asked and f"{probe.name}.{key[2]}" not in asked:
            continue
        outlier = outlier or any(stats.first_run_outlier(values[:plan[0]], measured.direction)
                                 for values in (base, cand))
        try:
            result = stats.sequential_compare(
                base, cand, plan=plan, direction=measured.direction, seed=seed,
                margin=margin.of(probe.name, key[2], measured.margin))
        except ValueError:
            continue
        # Load blurs speed; errors, counts and memory are what the code computes, not faster
        # or slower for repeating them.
        more = more or (measured.kind in PERFORMANCE_KINDS
                        and stats.more_would_decide(result, plan))
    return LookState(outlier, more)


def asked_metrics(experiment: Experiment) -> set[str]:
    """The "probe.metric"s the experiment's question reads: its goal's metric (the margin's)
    and its criteria's. Empty: it was asked nothing in particular, every comparison counts."""
    asked = {f"{spec.get('probe')}.{spec.get('metric')}" for spec in experiment.criteria or []
             if isinstance(spec, dict)}
    if experiment.margin_metric:
        asked.add(experiment.margin_metric)
    return asked


def _judged(probe: Probe, samples: dict[SampleKey, list[float]]
            ) -> Iterator[tuple[tuple[str, str, str, str], list[float], list[float], Metric]]:
    """The probe's series that are compared: (probe, variant, metric, case), the baseline's
    and the candidate's values, and what the metric measures; not those with fewer than
    MIN_SAMPLES a side or distorted by the instrument (_distorted)."""
    for key in sorted({key[:4] for key in samples if key[0] == probe.name}):
        base = samples.get((*key, "baseline"), [])
        cand = samples.get((*key, "candidate"), [])
        measured = probe.metric(key[2])
        if min(len(base), len(cand)) >= stats.MIN_SAMPLES and not _distorted(probe, measured):
            yield key, base, cand, measured


def _performance(probes: list[Probe], samples: dict[SampleKey, list[float]], *, seed: int,
                 margin: _Margin) -> list[Finding]:
    by_probe = {p.name: p for p in probes}
    found: list[Finding] = []
    too_few: dict[tuple[str, str], int] = {}
    distorted: dict[tuple[str, str], str] = {}
    keys = sorted({key[:4] for key in samples})
    for probe_name, variant, metric, case in keys:
        probe = by_probe.get(probe_name)
        if probe is None:
            continue
        base = samples.get((probe_name, variant, metric, case, "baseline"), [])
        cand = samples.get((probe_name, variant, metric, case, "candidate"), [])
        if not base or not cand:
            continue
        if min(len(base), len(cand)) < stats.MIN_SAMPLES:
            too_few[(probe_name, metric)] = min(len(base), len(cand))
            continue
        evidence = {"probe": probe_name, "variant": variant, "metric": metric, "case": case}
        measured = probe.metric(metric)
        if _distorted(probe, measured):
            distorted.setdefault((probe_name, metric), case)
            continue
        try:
            result = stats.sequential_compare(
                base, cand, plan=sample_plan(probe), direction=measured.direction, seed=seed,
                margin=margin.of(probe_name, metric, measured.margin))
        except ValueError as exc:
            found.append(Finding("performance", "not-comparable", feedback.WARN,
                                 f"{feedback.where(probe_name, variant, case)} {metric}",
                                 f"not compared: {exc}", feedback.METRIC, evidence))
            continue
        found += feedback.performance_findings(probe_name, variant, metric, case, "", result,
                                               evidence, plausible=probe.plausible_speedup,
                                               kind=measured.kind)
    for probe_name, metric in sorted(distorted):
        found.append(Finding(
            "performance", "not-judged", feedback.INFO, f"{probe_name} {metric} not judged",
            f"{metric} is a time measured while the probe ran under the instruction counter "
            "(measure = \"instructions\"), which slows every run many times over and unevenly: "
            "it is not judged in that mode; the probe's instructions are", feedback.PROBE,
            {"probe": probe_name, "metric": metric}))
    for (probe_name, metric), n in sorted(too_few.items()):
        probe = by_probe[probe_name]
        found.append(Finding(
            "performance", "too-few-samples", feedback.INFO, f"{probe_name} {metric} not compared",
            f"{n} execution(s) a side (repeat = {probe.repeat}): {stats.MIN_SAMPLES} are "
            f"needed to compare and {stats.min_rank_repeats(0.01)} to call a change at "
            "p < 0.01; a performance probe repeats 5 times by default", feedback.PROBE,
            {"probe": probe_name, "metric": metric, "n": n}))
    return found


def _distorted(probe: Probe, metric: Metric) -> bool:
    """Whether the probe's instrument distorts the metric: a time (wall time, not the
    instruction count itself) measured under callgrind."""
    return (probe.measure == "instructions" and metric.kind == "time"
            and metric.name != "instructions")


def _distributions(samples: dict[SampleKey, list[float]],
                   units: dict[tuple[str, str, str, str], str] | None = None, limit: int = 8
                   ) -> list[dict[str, Any]]:
    """Per compared key, both sides' per-execution values and their unit (for the A/B
    chart); cases in numeric order (len-64 before len-256)."""
    keys = sorted({key[:4] for key in samples},
                  key=lambda key: tuple(natural_key(part) for part in key))[:limit]
    units = units or {}
    return [{"label": " ".join(filter(None, (probe, f"[{variant}]" if variant else "", metric,
                                              case))),
             "metric": metric, "unit": units.get((probe, variant, metric, case), ""),
             "baseline": samples.get((probe, variant, metric, case, "baseline"), []),
             "candidate": samples.get((probe, variant, metric, case, "candidate"), [])}
            for probe, variant, metric, case in keys]


def _error_curves(probes: Sequence[Probe], rows: Sequence[SampleRow],
                  sizes: dict[int, dict[str, float]]) -> list[dict[str, Any]]:
    """The error-versus-size curve of a probe that writes its errors as metrics rather than
    outputs to compare (the numerics goals' probes, which the tuner's experiments run): per
    probe, variant, metric of kind error and side, the median error of each case that has a
    size (its `size` label) against that size; a curve needs two sizes. Drawn beside the
    output comparisons' curves (feedback["series"])."""
    declared = {p.name: p for p in probes}
    found: dict[tuple[str, str, str, str], dict[float, list[float]]] = defaultdict(
        lambda: defaultdict(list))
    for row in rows:
        probe = declared.get(row.probe)
        size = sizes.get(row.execution, {}).get(row.case) if row.case else None
        if probe is not None and size is not None and probe.metric(row.metric).kind == "error":
            found[(row.probe, row.variant, row.metric, row.side)][size].append(row.value)
    return [{"probe": probe, "metric": metric, "side": side,
             "label": " ".join(filter(None, (probe, f"[{variant}]" if variant else "", side))),
             "points": [[size, float(np.median(values))]
                        for size, values in sorted(by_size.items())]}
            for (probe, variant, metric, side), by_size in sorted(found.items())
            if len(by_size) >= 2]


# --- correctness and integrity ---------------------------------------------------------------

def _outputs_dir(execution: ProbeExecution | None, scratch: Path) -> Path | None:
    """A folder holding the execution's outputs/ files, linked out of the blob store; None
    when there is no execution."""
    if execution is None:
        return None
    folder = scratch / f"exec-{execution.pk}"
    if folder.exists():
        return folder
    return link_outputs(folder, execution.artifacts.all())


def link_outputs(folder: Path, artifacts: Iterable[Artifact]) -> Path:
    """A new `folder` holding the outputs/<name> files among `artifacts`, hard-linked out of
    the blob store (copied where a link cannot be made)."""
    folder.mkdir()
    store = blob_store()
    for artifact in artifacts:
        if not artifact.name.startswith("outputs/") or artifact.name.count("/") != 1:
            continue
        destination = folder / artifact.name.removeprefix("outputs/")
        source = store.local_path(artifact.sha256)
        try:
            os.link(source, destination)
        except OSError:
            shutil.copyfile(source, destination)
    return folder


@dataclass(frozen=True)
class _Pair:
    """A reference execution and the one compared with it, under the main seed and (where it
    ran) the second seed."""

    label: str
    reference: ProbeExecution | None
    candidate: ProbeExecution | None
    reference_check: ProbeExecution | None  # the same cells under the second seed
    candidate_check: ProbeExecution | None
    reference_again: ProbeExecution | None  # the reference's next repeat, same seed
    rtol: float
    atol: float


def _compare(context: _Context, reference: ProbeExecution | None,
             candidate: ProbeExecution | None, *, rtol: float, atol: float
             ) -> list[CaseComparison] | None:
    """Case by case, or None when either execution is missing or neither wrote outputs."""
    key = (reference.pk if reference else 0, candidate.pk if candidate else 0, rtol, atol)
    if key not in context.compared:
        context.compared[key] = _compare_dirs(context, reference, candidate, rtol=rtol,
                                              atol=atol)
    return context.compared[key]


def _compare_dirs(context: _Context, reference: ProbeExecution | None,
                  candidate: ProbeExecution | None, *, rtol: float, atol: float
                  ) -> list[CaseComparison] | None:
    ref_dir = _outputs_dir(reference, context.scratch)
    cand_dir = _outputs_dir(candidate, context.scratch)
    if ref_dir is None or cand_dir is None or not (any(ref_dir.iterdir())
                                                    or any(cand_dir.iterdir())):
        return None
    sizes = {**context.sizes.get(candidate.pk if candidate else 0, {}),
             **context.sizes.get(reference.pk if reference else 0, {})}
    return correctness.compare_output_dirs(ref_dir, cand_dir, rtol=rtol, atol=atol,
                                           sizes=sizes or None)


def _correctness(context: _Context, probe: Probe) -> list[Finding]:
    """Variant rules on both sides, then candidate against baseline per variant: a change of
    outputs fails, except at the cases where the baseline itself failed a rule (a fix must
    change those); then the integrity rules on every pair."""
    found: list[Finding] = []
    runs = context.runs
    rtol = probe.compare[0].rtol if probe.compare else DEFAULT_RTOL
    atol = probe.compare[0].atol if probe.compare else DEFAULT_ATOL
    # What the baseline already gets wrong, under either seed: by variant (the candidate
    # cell of a rule) and by rule. A fix must change those outputs; they are not the
    # candidate's fault when they fail under one seed only.
    baseline_wrong: dict[str, set[str]] = defaultdict(set)
    rule_wrong: dict[str, set[str]] = defaultdict(set)
    pairs = list(_rule_pairs(probe, runs))
    for pair, side in pairs:
        if side != "baseline" or pair.candidate is None:
            continue
        for reference, candidate in ((pair.reference, pair.candidate),
                                     (pair.reference_check, pair.candidate_check)):
            failing = {c.case for c in _compare(context, reference, candidate, rtol=pair.rtol,
                                                atol=pair.atol) or [] if not c.ok}
            baseline_wrong[pair.candidate.variant] |= failing
            rule_wrong[_rule_of(pair.label)] |= failing
    rule_findings: list[Finding] = []
    for pair, side in pairs:
        comparisons = _compare(context, pair.reference, pair.candidate, rtol=pair.rtol,
                               atol=pair.atol)
        if comparisons is None:
            continue
        rule_findings += _pair_findings(context, probe, pair, comparisons, feedback.FAIL)
        if side == "candidate":
            rule_findings += _seed_findings(context, probe, pair, comparisons,
                                            excused=rule_wrong.get(_rule_of(pair.label), set()))
    found += _framed(rule_findings)
    found += _rules_not_run(context.experiment, probe)
    for variant in context.experiment.variant_cells(probe):
        key = variant_key(variant)
        pair = _Pair(f"candidate vs baseline [{key or 'default'}]",
                     runs.get((probe.name, "baseline", key, 0)),
                     runs.get((probe.name, "candidate", key, 0)),
                     runs.get((probe.name, "baseline", key, -1)),
                     runs.get((probe.name, "candidate", key, -1)),
                     runs.get((probe.name, "baseline", key, 1)), rtol, atol)
        comparisons = _compare(context, pair.reference, pair.candidate, rtol=rtol, atol=atol)
        if comparisons is None:
            continue
        excused = baseline_wrong.get(key, set())
        found += _pair_findings(context, probe, pair, comparisons, feedback.FAIL,
                                excused=excused)
        found += _seed_findings(context, probe, pair, comparisons, excused=excused)
    return found


def _rules_not_run(experiment: Experiment, probe: Probe) -> list[Finding]:
    """One note per compare rule with a pair of cells this experiment did not run (its
    `variants` left one of them out): that pair is not checked, neither passed nor failed."""
    found = []
    for rule in probe.compare:
        pairs = [(variant_key(v), variant_key(v | rule.reference)) for v in probe.variant_matrix()
                 if all(v.get(k) == value for k, value in rule.candidate.items())]
        skipped = [(cand, ref) for cand, ref in pairs
                   if not (experiment.runs_cell(probe.name, cand)
                           and experiment.runs_cell(probe.name, ref))]
        if not skipped:
            continue
        missing = sorted({cell for pair in skipped for cell in pair
                          if not experiment.runs_cell(probe.name, cell)})
        shown = ", ".join(f"[{cand}] vs [{ref}]" for cand, ref in skipped[:6])
        rule_label = f"[{variant_key(rule.candidate)}] vs [{variant_key(rule.reference)}]"
        found.append(Finding(
            "correctness", "rule-not-run", feedback.INFO,
            f"{probe.name} {rule_label} not run in this experiment",
            f"{len(skipped)} of {len(pairs)} pairs of this compare rule not checked ({shown}): "
            f"cells {', '.join(f'[{c}]' for c in missing)} were not run in this experiment "
            "(its variants leave them out); run them to check the rule", feedback.PROBE,
            {"probe": probe.name, "rule": rule_label, "not_run": missing,
             "pairs": [list(pair) for pair in skipped[:50]]}))
    return found


def _rule_of(label: str) -> str:
    """'[cp=on] vs [cp=off] (candidate)' -> '[cp=on] vs [cp=off]'."""
    return label.rpartition(" (")[0] or label


def _rule_pairs(probe: Probe, runs: Runs) -> Iterator[tuple[_Pair, str]]:
    """Each compare rule's reference and candidate cells, on each side."""
    for rule in probe.compare:
        for variant in probe.variant_matrix():
            if any(variant.get(k) != v for k, v in rule.candidate.items()):
                continue
            ref_key, cand_key = variant_key(variant | rule.reference), variant_key(variant)
            for side in ("candidate", "baseline"):
                yield _Pair(f"[{cand_key}] vs [{ref_key}] ({side})",
                            runs.get((probe.name, side, ref_key, 0)),
                            runs.get((probe.name, side, cand_key, 0)),
                            runs.get((probe.name, side, ref_key, -1)),
                            runs.get((probe.name, side, cand_key, -1)),
                            runs.get((probe.name, side, ref_key, 1)),
                            rule.rtol, rule.atol), side


def _pair_findings(context: _Context, probe: Probe, pair: _Pair,
                   comparisons: list[CaseComparison], severity: str, *,
                   excused: set[str] | None = None) -> list[Finding]:
    """Case findings, degenerate outputs and the error-versus-size series of one pair.
    Mismatches at `excused` cases (the baseline was wrong there) are warnings."""
    executions = [e for e in (pair.reference, pair.candidate) if e is not None]
    evidence: dict[str, Any] = {
        "probe": probe.name, "compared": pair.label, "executions": [e.pk for e in executions],
        "seeds": sorted({e.seed for e in executions if e.seed is not None}),
        "variants": [e.variant for e in executions]}
    excused = excused or set()
    found = feedback.correctness_findings(
        probe.name, pair.label, [c for c in comparisons if c.case not in excused], evidence,
        severity=severity)
    changed = [c for c in comparisons if c.case in excused and not c.ok]
    if changed:
        cases = ", ".join(c.case for c in changed[:6])
        found.append(Finding(
            "correctness", "outputs-fixed", feedback.INFO,
            f"{probe.name} {pair.label}: outputs changed where the baseline was wrong",
            f"cases {cases} differ from the baseline, which failed its own variant check "
            "there: a fix has to change them", feedback.PROBE, evidence | {"cases": cases}))
    found += _degenerate(context, probe, pair, comparisons, evidence)
    if any(c.size is not None for c in comparisons):
        # Absolute error first: relative error is dominated by near-zero reference values.
        series = correctness.error_series(comparisons, metric="max_abs_error")
        relative = correctness.error_series(comparisons, metric="max_rel_error")
        if relative.growing and not series.growing:
            series = relative
        context.extras["series"].append({"probe": probe.name, "label": pair.label,
                                         **series.as_dict()})
        # A growing error that still fits the tolerance everywhere is a warning to watch; one
        # that only the cases the baseline got wrong exceed is what a fix looks like.
        within = all(c.ok for c in comparisons)
        explained = not within and all(c.ok for c in comparisons if c.case not in excused)
        share = _share_of_tolerance(series, pair)
        negligible = within and share is not None and share < WATCH_SHARE
        note = (f"at most {share:.2g} of the tolerance: round-off far inside it"
                if negligible and share is not None else "")
        finding = feedback.series_finding(
            probe.name, pair.label, series, evidence, note=note,
            severity=feedback.INFO if explained or negligible
            else feedback.WARN if within else severity)
        if finding is not None:
            found.append(finding)
    return found


# A growing error within tolerance is worth watching from this share of the tolerance on;
# under it (round-off from 5e-14 to 2e-12 under a 1e-9 tolerance) it is a note.
WATCH_SHARE = 0.1


def _share_of_tolerance(series: correctness.ErrorSeries, pair: _Pair) -> float | None:
    """The series' largest error as a share of the smallest bound it could be held to: atol
    for absolute errors, rtol for relative ones (each a lower bound of atol + rtol * |ref|
    per element). None when that bound is 0."""
    bound = pair.rtol if series.metric == "max_rel_error" else pair.atol
    worst = max((error for _, error in series.points), default=0.0)
    return worst / bound if bound > 0 else None


def _degenerate(context: _Context, probe: Probe, pair: _Pair,
                comparisons: list[CaseComparison], evidence: dict[str, Any]) -> list[Finding]:
    """All-zero or constant candidate outputs against a reference that varies, in every
    output format the contract accepts: .npy arrays, JSON numbers and nested lists."""
    ref_dir = _outputs_dir(pair.reference, context.scratch)
    cand_dir = _outputs_dir(pair.candidate, context.scratch)
    if ref_dir is None or cand_dir is None:
        return []
    found = []
    for c in comparisons:
        if c.ok or c.status in ("missing-reference", "missing-candidate", "unreadable"):
            continue  # a constant that matches within tolerance is a right answer
        reference = _numbers(ref_dir, c.case)
        candidate = _numbers(cand_dir, c.case)
        if reference is None or candidate is None or candidate.size < 2 or reference.size < 2:
            continue
        if _constant(candidate) and not _constant(reference):
            what = "all zero" if not np.any(candidate) else f"constant ({candidate[0]:.6g})"
            found.append(Finding(
                "integrity", "degenerate-output", feedback.FAIL,
                f"{probe.name} {pair.label} case {c.case} output is {what}",
                f"the candidate's {candidate.size} numbers are {what} while the reference's "
                "vary: the computation was probably skipped", feedback.CASE,
                evidence | {"case": c.case}))
    return found


def _numbers(folder: Path, case: str) -> np.ndarray[Any, Any] | None:
    """Every number of a case's output, flattened (JSON: numbers in nested lists and objects,
    booleans excluded); None when unreadable or not numeric."""
    for suffix in (".npy", ".json"):
        path = folder / f"{case}{suffix}"
        if not path.is_file():
            continue
        try:
            value = correctness.load_output(path, max_bytes=OUTPUT_MAX_BYTES)
        except ValueError:
            return None
        if isinstance(value, np.ndarray):
            if value.dtype.kind not in "iufcb":
                return None
            return value.reshape(-1)
        if isinstance(value, dict):  # a top-level "size" is the case's size, not a result
            value = {k: v for k, v in value.items() if k != "size"}
        numbers = list(_json_numbers(value))
        return np.asarray(numbers, dtype=float) if numbers else None
    return None


def _json_numbers(value: object) -> Iterator[float]:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, bool):
            continue
        if isinstance(item, int | float):
            number = float(item) if not isinstance(item, int) or abs(item) < 2**1023 else math.inf
            yield number
        elif isinstance(item, list | tuple):
            stack.extend(reversed(item))
        elif isinstance(item, dict):
            stack.extend(reversed(list(item.values())))


def _constant(values: np.ndarray[Any, Any]) -> bool:
    return bool(np.all(values == values[0]))


def _seed_findings(context: _Context, probe: Probe, pair: _Pair,
                   comparisons: list[CaseComparison], *, excused: set[str]) -> list[Finding]:
    """Outputs that do not follow the input: the reference changes with the seed but the
    candidate does not ("hard-coded or cached output"), or the candidate matches the
    reference under one seed only. Needs the second-seed executions (the warm-ups)."""
    if pair.reference_check is None or pair.candidate_check is None:
        return []
    checked = _compare(context, pair.reference_check, pair.candidate_check, rtol=pair.rtol,
                       atol=pair.atol)
    # The reference must move beyond the tolerance: run-to-run noise in its last bits (a
    # parallel reduction) is not the input changing.
    ref_moved = _compare(context, pair.reference, pair.reference_check, rtol=pair.rtol,
                         atol=pair.atol)
    cand_moved = _compare(context, pair.candidate, pair.candidate_check, rtol=0.0, atol=0.0)
    if checked is None or ref_moved is None or cand_moved is None:
        return []
    # A reference that differs between two runs of one seed is not seed-driven: it is noisy.
    noisy = _compare(context, pair.reference, pair.reference_again, rtol=0.0, atol=0.0) or []
    unstable = {c.case for c in noisy if not c.ok}
    seeds = (pair.candidate.seed if pair.candidate else None, pair.candidate_check.seed)
    evidence = {"probe": probe.name, "compared": pair.label, "seeds": list(seeds),
                "executions": [e.pk for e in (pair.reference, pair.candidate,
                                              pair.reference_check, pair.candidate_check)
                               if e is not None]}
    first = {c.case: c for c in comparisons}
    second = {c.case: c for c in checked}
    moved = {c.case: not c.ok for c in ref_moved if c.status in ("match", "mismatch")}
    fixed = {c.case: c.ok for c in cand_moved if c.status in ("match", "mismatch")}
    found = []
    for case in sorted(set(first) & set(second), key=natural_key):
        if case in excused:
            continue
        a, b = first[case], second[case]
        if moved.get(case) and fixed.get(case) and case not in unstable:
            found.append(Finding(
                "integrity", "hard-coded-output", feedback.FAIL,
                f"{probe.name} {pair.label} case {case}: hard-coded or cached output",
                f"the reference's output changes between seed {seeds[0]} and seed {seeds[1]} "
                "but the candidate's is byte for byte the same: it does not follow the input",
                feedback.CASE, evidence | {"case": case}))
        elif a.ok != b.ok and "missing-reference" not in (a.status, b.status):
            good, bad = (seeds[0], seeds[1]) if a.ok else (seeds[1], seeds[0])
            failing = b if a.ok else a
            found.append(Finding(
                "integrity", "matches-one-seed", feedback.FAIL,
                f"{probe.name} {pair.label} case {case} matches only under one seed",
                f"it matches under seed {good} but not under seed {bad}: {failing.detail}",
                feedback.CASE, evidence | {"case": case, "seed": bad,
                                           "comparison": failing.as_dict()}))
    return found


def _framed(findings: list[Finding]) -> list[Finding]:
    """Candidate against baseline: per variant rule, a baseline failure the candidate no
    longer has becomes one "fixed" finding; one it still has is a note on the candidate's."""
    by_rule: dict[tuple[str, str], dict[str, list[Finding]]] = defaultdict(
        lambda: {"candidate": [], "baseline": []})
    for finding in findings:
        compared = str(finding.evidence.get("compared", ""))
        rule, _, side = compared.rpartition(" (")
        by_rule[(str(finding.evidence.get("probe", "")), rule)][side.rstrip(")")].append(finding)
    result: list[Finding] = []
    for (probe, rule), sides in by_rule.items():
        candidate, baseline = sides["candidate"], sides["baseline"]
        base_failing = [f for f in baseline if f.severity == feedback.FAIL]
        cand_failing = [f for f in candidate if f.severity == feedback.FAIL]
        result += candidate
        if not base_failing:
            result += baseline
        elif cand_failing or not candidate:
            result.append(_as_context(probe, rule, base_failing))
        else:
            result.append(_fixed(probe, rule, base_failing, candidate))
    return result


def _as_context(probe: str, rule: str, failing: list[Finding]) -> Finding:
    cases = ", ".join(str(f.evidence.get("case", "")) for f in failing if f.evidence.get("case"))
    return Finding("correctness", "baseline-failing", feedback.INFO,
                   f"{probe} {rule} fails on the baseline too",
                   f"{len(failing)} failing findings on the baseline"
                   + (f" (cases {cases})" if cases else "")
                   + ": not caused by this change", feedback.PROBE,
                   {"probe": probe, "compared": f"{rule} (baseline)",
                    "baseline": [f.as_dict() for f in failing[:10]]})


def _fixed(probe: str, rule: str, failing: list[Finding], candidate: list[Finding]
           ) -> Finding:
    cases = [str(f.evidence.get("case")) for f in failing if f.evidence.get("case")]
    what = [f.detail for f in failing if f.kind == "error-vs-size"]
    shown = ", ".join(cases[:6]) + (f" and {len(cases) - 6} more" if len(cases) > 6 else "")
    def error(f: Finding) -> float:
        return float((f.evidence.get("comparison") or {}).get("max_abs_error") or 0.0)

    worst = sorted((f for f in failing if f.evidence.get("case")), key=error, reverse=True)
    firsts = [f"worst {worst[0].detail}"] if worst else []
    detail = (f"the baseline failed {len(failing)} checks" + (f" at cases {shown}" if shown
                                                               else "")
              + (f" ({firsts[0]})" if firsts else "")
              + (f"; its error {what[0]}" if what else "")
              + "; the candidate passes: " + "; ".join(f.detail for f in candidate[:2]))
    evidence = {"probe": probe, "compared": rule, "cases": cases,
                "baseline": [f.as_dict() for f in failing[:10]]}
    return Finding("correctness", "fixed", feedback.PASS, f"{probe} {rule} fixed", detail,
                   feedback.PROBE, evidence)


# --- criteria --------------------------------------------------------------------------------

def _criteria(experiment: Experiment, samples: dict[SampleKey, list[float]]) -> list[Finding]:
    """One finding per criterion: passed or failed on the samples, or a note when it needs a
    variant cell this experiment did not run (see _criterion_not_run)."""
    found = []
    for spec in experiment.criteria:
        missing = [cell for cell in criterion_cells(spec)
                   if not experiment.runs_cell(spec["probe"], cell)]
        if missing:
            found.append(_criterion_not_run(experiment, spec, missing))
            continue
        def values(variant: str, side: str, spec: dict[str, Any] = spec) -> list[float]:
            return [v for (probe, var, metric, _case, s), vals in samples.items()
                    if probe == spec["probe"] and metric == spec["metric"] and s == side
                    and variant in ("", var) for v in vals]

        verdict = evaluate_criterion_ci(spec, values, seed=experiment.pk)
        name = criterion_name(spec)
        condition = spec.get("description") or ""
        detail = verdict.detail if not condition or condition == name \
            else f"{condition}: {verdict.detail}"
        found.append(Finding(
            "criteria", "criterion", feedback.PASS if verdict.passed else feedback.FAIL,
            f"criterion '{name}' {'passed' if verdict.passed else 'failed'}", detail,
            feedback.METRIC,
            {"probe": spec["probe"], "metric": spec["metric"], "criterion": spec.get("id"),
             "name": name,
             # The criterion as measured: the merge gate matches it to the pinned version's.
             "spec": {k: spec.get(k) for k in CRITERION_KEYS},
             "verdict": verdict.as_dict()}))
    return found


def _criterion_not_run(experiment: Experiment, spec: dict[str, Any], missing: list[str]
                       ) -> Finding:
    """A criterion that needs cells the experiment's `variants` left out: neither passed nor
    failed but not judged (a note; the merge gate still counts it as not passed)."""
    name = criterion_name(spec)
    cells = ", ".join(f"[{cell}]" for cell in missing)
    ran = ", ".join(f"[{cell}]" for cell in experiment.variants.get(spec["probe"], []))
    detail = (f"not run in this experiment: it needs cell {cells} of {spec['probe']}, which "
              f"this experiment did not run (it ran {ran or 'none'}); run that cell to judge it")
    verdict = IntervalVerdict(name, False, None, None, None, detail)
    return Finding(
        "criteria", "criterion-not-run", feedback.INFO, f"criterion '{name}' not run", detail,
        feedback.METRIC,
        {"probe": spec["probe"], "metric": spec["metric"], "criterion": spec.get("id"),
         "name": name, "spec": {k: spec.get(k) for k in CRITERION_KEYS},
         "verdict": verdict.as_dict(), "not_run": missing})
