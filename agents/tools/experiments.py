"""Experiment tools: questions the agent asks of its run's experiments beyond their feedback.

- ``probe_error``: why a probe execution failed (status, reason, the end of its stderr) and
  whether the baseline fails too;
- ``list_probes``: the run's pinned manifest probes, cheapest first, with their variant cells;
- ``compare_experiments``: two experiments side by side (medians, ratios, verdicts, criteria);
- ``case_detail``: per-case numbers of a correctness probe's comparisons;
- ``span_summary``: one span's statistics on both sides' traces and what overlaps it.

Contracts: every tool reads only the run's own experiments (``run_experiment_of``), says so in
``ctx.effects.experiment``, answers within ``MAX_RESULT_CHARS`` (each part has its own bound
below) and raises ToolError, with a hint naming what exists, for an unknown id, probe, case or
span. They read what the experiment stored (executions, summary, feedback, artifacts); only
``case_detail`` recomputes, one named case whose numbers were not stored, within
RECOMPUTE_MAX_BYTES. Results that carry probe output (stderr, metric, case and span names) are
marked untrusted.
"""

from __future__ import annotations

import fnmatch
import shutil
import tempfile
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings

from agents.policies.shared import failing_check_findings, pinned_manifest
from agents.tools.base import ToolContext, ToolError, ToolResult, tool
from agents.tools.run import run_experiment_of, the_run
from agents.tools.schema import MAX_ID, integer, obj, string
from infraops.experiments.analysis import link_outputs
from infraops.experiments.behaviour import TRACE_MAX_BYTES
from infraops.experiments.blobstore import blob_store
from infraops.experiments.services import reproduce_command
from infraops.feedback import correctness, traces
from infraops.feedback.correctness import natural_key
from infraops.feedback.findings import case_titles
from infraops.manifest import DEFAULT_ATOL, DEFAULT_RTOL, Probe
from infraops.models import Artifact, Experiment, ProbeExecution, variant_key

STDERR_TAIL_CHARS = 4000
STDOUT_TAIL_CHARS = 1000
MORE_FAILURES = 10  # further failures listed, one line each
MAX_CELLS = 50  # variant cells listed per probe
MAX_ROWS = 40  # metric rows of compare_experiments
MAX_CASE_LINES = 60  # case lines of case_detail
MAX_PASSING_NAMED = 30  # passing cases named per comparison
RECOMPUTE_MAX_BYTES = 16 << 20  # a stored output larger than this is not recomputed
MAX_RECOMPUTED = 8  # comparisons recomputed for one named case
MAX_TRACE_GROUPS = 4  # (probe, variant) pairs of traces span_summary reads
MAX_OVERLAPS = 5  # other spans whose overlap is given, per side
MAX_SPAN_NAMES = 20  # span names named when the span is not found

_ID = integer("The experiment's id (run_experiment gave it).", 1, MAX_ID)
_PROBE = string("A probe name from list_probes.", 200, minLength=1)


def _read(ctx: ToolContext, pk: int) -> Experiment:
    """The run's experiment `pk`, recorded as the one this call read."""
    experiment = run_experiment_of(ctx, pk)
    ctx.effects.experiment = experiment.pk
    return experiment


def _attempt(experiment: Experiment) -> int:
    """The attempt whose results the experiment shows: its summary's, else its last."""
    return int(experiment.summary.get("attempt") or experiment.attempts)


def _executions(experiment: Experiment, probe: str | None = None) -> list[ProbeExecution]:
    """The shown attempt's executions, in the order they ran (optionally of one probe)."""
    rows = ProbeExecution.objects.filter(experiment=experiment, attempt=_attempt(experiment))
    if probe is not None:
        rows = rows.filter(probe=probe)
    return list(rows.order_by("id").defer("stdout"))


def _check_probe(experiment: Experiment, probe: str) -> None:
    """ToolError naming the experiment's probes unless it ran (or chose) `probe`."""
    if probe not in experiment.probes:
        raise ToolError(f"experiment {experiment.pk} has no probe {probe!r}",
                        f"Its probes: {', '.join(experiment.probes) or 'none'}.")


def _where(execution: ProbeExecution) -> str:
    which = "warm-up" if execution.is_warmup else f"repeat {execution.repeat_index}"
    return f"{execution.probe} {execution.side} [{execution.variant or 'default'}] {which}"


def _status(execution: ProbeExecution) -> str:
    code = execution.exit_code
    return (f"exit status {code}" if code is not None else "no exit status") + \
        f", reason {execution.reason}"


def _tail(text: str, limit: int) -> str:
    """The end of `text`, at most `limit` characters, starting at a line where it can; says
    how much was left out."""
    text = text.rstrip()
    if len(text) <= limit:
        return text
    cut = text[-limit:]
    newline = cut.find("\n")
    if 0 <= newline < limit // 10:
        cut = cut[newline + 1:]
    return f"[... {len(text) - len(cut)} earlier characters not shown]\n{cut}"


def _number(value: Any, spec: str = ".4g") -> str:
    return format(value, spec) if isinstance(value, int | float) else "n/a"


def _duration(us: float) -> str:
    """'850 µs', '4.20 ms', '1.23 s'."""
    if abs(us) < 1000:
        return f"{us:.3g} µs"
    if abs(us) < 1_000_000:
        return f"{us / 1000:.3g} ms"
    return f"{us / 1_000_000:.3g} s"


def _more(count: int, shown: int, what: str) -> list[str]:
    return [f"({count - shown} more {what} not shown)"] if count > shown else []


# --------------------------------------------------------------------------- probe_error


@tool(
    "probe_error",
    "Why a probe failed: exit, stderr tail.",
    obj({"experiment_id": _ID, "probe": _PROBE}, required=["experiment_id"]),
    untrusted=True, needs_run=True,
)
def _probe_error(ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
    experiment = _read(ctx, args["experiment_id"])
    probe = args.get("probe")
    if probe is not None:
        _check_probe(experiment, probe)
    executions = _executions(experiment)
    failed = [e for e in executions if e.reason != "ok" and probe in (None, e.probe)]
    if not failed:
        return ToolResult(True, _nothing_failed(experiment, probe),
                          {"experiment": experiment.pk, "failed": 0})
    first = failed[0]
    sides, sentence = _which_sides(first, executions)
    lines = [f"Experiment {experiment.pk} ({experiment.status}): {len(failed)} failed "
             f"execution{'s' if len(failed) != 1 else ''}"
             + (f" of {probe}" if probe else "") + f". The first: {_where(first)}.",
             f"Exit: {_status(first)}.", f"Sides: {sentence}."]
    if first.detail:
        lines.append(f"Detail: {first.detail[:500]}")
    lines += _output_tail(first)
    lines += _reproduce(ctx, experiment, first)
    others = failed[1:]
    if others:
        lines.append("Also failed:")
        lines += [f"- {_where(e)}: {_status(e)}" for e in others[:MORE_FAILURES]]
        lines += _more(len(others), MORE_FAILURES, "failed executions")
    return ToolResult(True, "\n".join(lines), {
        "experiment": experiment.pk, "failed": len(failed), "execution": first.pk,
        "probe": first.probe, "side": first.side, "variant": first.variant,
        "repeat": first.repeat_index, "exit_code": first.exit_code, "reason": first.reason,
        "sides": sides})


def _nothing_failed(experiment: Experiment, probe: str | None) -> str:
    text = f"No probe failed in experiment {experiment.pk}" + (f" ({probe})" if probe else "")
    if not experiment.is_finished:
        return text + f" so far: it is {experiment.status}."
    if experiment.failure_reason:
        return text + f"; the experiment {experiment.status}: {experiment.failure_reason[:1000]}"
    return text + f"; it {experiment.status}."


def _which_sides(failed: ProbeExecution, executions: Sequence[ProbeExecution]
                 ) -> tuple[str, str]:
    """(code, sentence): whether the failure is the candidate's alone, from what the other
    side did with the same probe and variant in this attempt (a probe stops at its first
    failed execution, so the side that failed first is usually the only one that failed).
    Codes: "candidate only" (the baseline ran it and exited 0), "baseline too" (the baseline
    fails: not the change's doing), "baseline only" (the candidate ran it and exited 0),
    "baseline not run" (not known)."""
    other = "baseline" if failed.side == "candidate" else "candidate"
    same = [e for e in executions if e.probe == failed.probe and e.variant == failed.variant
            and e.side == other]
    broken = [e for e in same if e.reason != "ok"]
    cell = f"{failed.probe} [{failed.variant or 'default'}]"
    if broken:
        return "baseline too", f"the {other} fails too ({_where(broken[0])}: {_status(broken[0])})"
    if same:
        code = "candidate only" if failed.side == "candidate" else "baseline only"
        return code, (f"{code}: the {other} ran {cell} {len(same)} time"
                      f"{'s' if len(same) != 1 else ''} in this attempt and exited 0")
    if failed.side == "baseline":
        return "baseline too", (f"the baseline fails: not the change's doing; the candidate "
                                f"did not run {cell} (a probe stops at its first failure)")
    return "baseline not run", f"not known for the baseline: it did not run {cell} here"


def _output_tail(execution: ProbeExecution) -> list[str]:
    if execution.stderr.strip():
        return [f"Stderr (the end):\n{_tail(execution.stderr, STDERR_TAIL_CHARS)}"]
    stdout = ProbeExecution.objects.filter(pk=execution.pk).values_list("stdout", flat=True)[0]
    if stdout.strip():
        return [f"It wrote nothing to stderr; its stdout (the end):\n"
                f"{_tail(stdout, STDOUT_TAIL_CHARS)}"]
    return ["It wrote nothing to stderr or stdout."]


def _reproduce(ctx: ToolContext, experiment: Experiment, execution: ProbeExecution) -> list[str]:
    probe = pinned_manifest(the_run(ctx)).probe(execution.probe)
    if probe is None:
        return []
    commit = (experiment.candidate_commit if execution.side == "candidate"
              else experiment.baseline_commit)
    return [f"Reproduce: {reproduce_command(probe, execution, commit)}"]


# --------------------------------------------------------------------------- list_probes


@tool(
    "list_probes",
    "Probes: cost, paths covered, variant cells, metrics.",
    obj({}),
    untrusted=True, needs_run=True,
)
def _list_probes(ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
    manifest = pinned_manifest(the_run(ctx))
    probes = sorted(manifest.probes, key=lambda p: p.cost)  # stable: manifest order on ties
    if not probes:
        return ToolResult(True, "The manifest has no probes.", {"probes": []})
    lines = [f"{len(probes)} probes, cheapest first:"]
    for probe in probes:
        lines += _probe_lines(probe)
    return ToolResult(True, "\n".join(lines), {"probes": [_probe_data(p) for p in probes]})


def _cells(probe: Probe) -> list[str]:
    return [variant_key(v) for v in probe.variant_matrix() if v]


def _probe_lines(probe: Probe) -> list[str]:
    metrics = ", ".join(probe.metrics) or "none (its verdict comes from outputs/)"
    lines = [f"- {probe.name} ({probe.layer}, cost {probe.cost}): covers "
             f"{', '.join(probe.covers)}; metrics {metrics}; repeat {probe.repeat} (up to "
             f"{probe.extra_repeats} more when undecided), warm-up {probe.warmup}; requires "
             f"{', '.join(probe.requires) or 'nothing'}"
             + ("; always runs" if probe.always else "")
             + ("; a compile cache each side (its first execution compiles, not a sample)"
                if probe.compile_cache else "")]
    cells = _cells(probe)
    if cells:
        shown = ", ".join(f"[{c}]" for c in cells[:MAX_CELLS])
        more = f" and {len(cells) - MAX_CELLS} more" if len(cells) > MAX_CELLS else ""
        lines.append(f"  variant cells ({len(cells)}): {shown}{more}")
    else:
        lines.append("  no variants (one cell)")
    for rule in probe.compare:
        lines.append(f"  compare: [{variant_key(rule.candidate)}] must match "
                     f"[{variant_key(rule.reference)}] (rtol {rule.rtol:g}, atol {rule.atol:g})")
    return lines


def _probe_data(probe: Probe) -> dict[str, Any]:
    return {"name": probe.name, "layer": probe.layer, "cost": probe.cost,
            "covers": list(probe.covers), "variants": _cells(probe)[:MAX_CELLS],
            "requires": list(probe.requires), "metrics": list(probe.metrics)}


# --------------------------------------------------------------------------- compare_experiments


Key = tuple[str, str, str, str]  # probe, variant, metric, case


@tool(
    "compare_experiments",
    "Two experiments side by side.",
    obj({"first_id": integer("One experiment's id.", 1, MAX_ID),
         "second_id": integer("The other experiment's id.", 1, MAX_ID)},
        required=["first_id", "second_id"]),
    untrusted=True, needs_run=True,
)
def _compare_experiments(ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
    if args["first_id"] == args["second_id"]:
        raise ToolError("both ids name the same experiment",
                        "Give two different experiments of this run.")
    first = _read(ctx, args["first_id"])
    second = _read(ctx, args["second_id"])
    pair = (first, second)
    lines = [_header(e) for e in pair]
    if first.candidate_commit == second.candidate_commit:
        lines.append("Both ran the same candidate commit: differences are run-to-run noise.")
    rows, differ = _metric_rows(pair)
    lines += rows
    differ += _checks_differ(pair)
    lines.append("Verdicts that differ: " + ("; ".join(differ) if differ else "none"))
    lines += _criteria_lines(pair)
    return ToolResult(True, "\n".join(lines), {
        "experiments": [first.pk, second.pk], "verdicts_differ": differ[:MAX_ROWS]})


def _header(experiment: Experiment) -> str:
    variants = "; ".join(f"{p}: {', '.join(cells)}" for p, cells in experiment.variants.items())
    verdict = experiment.feedback.get("verdict") or "no feedback yet"
    return (f"#{experiment.pk}: {experiment.status}, candidate "
            f"{experiment.candidate_commit[:10]} vs baseline {experiment.baseline_commit[:10]}"
            f"; probes {', '.join(experiment.probes)}"
            + (f" (cells {variants})" if variants else "") + f"; verdict: {verdict}")


def _checks_differ(pair: tuple[Experiment, Experiment]) -> list[str]:
    """The correctness and integrity checks that fail in one experiment and not the other:
    a verdict as much as a metric's. One per case: two experiments failing one cause at
    different cases differ by those cases."""
    first, second = ({title for f in failing_check_findings(e) for title in case_titles(f)}
                     for e in pair)
    return ([f"{title}: fails in #{pair[0].pk}, not in #{pair[1].pk}"
             for title in sorted(first - second)]
            + [f"{title}: fails in #{pair[1].pk}, not in #{pair[0].pk}"
               for title in sorted(second - first)])


def _comparisons(experiment: Experiment) -> dict[Key, dict[str, Any]]:
    return {(c["probe"], c["variant"], c["metric"], c["case"]): c
            for c in experiment.summary.get("comparisons", [])}


def _verdicts(experiment: Experiment) -> dict[Key, str]:
    """Key -> the performance verdict of its feedback (improved, regressed, ...)."""
    result = {}
    for finding in experiment.feedback.get("findings", []):
        if finding.get("kind") != "perf-comparison":
            continue
        e = finding.get("evidence") or {}
        key = (e.get("probe", ""), e.get("variant", ""), e.get("metric", ""), e.get("case", ""))
        result[key] = (e.get("comparison") or {}).get("verdict", "not compared")
    return result


def _metric_rows(pair: tuple[Experiment, Experiment]) -> tuple[list[str], list[str]]:
    """One line per probe.metric (variant, case) of either experiment, and the keys whose
    verdicts differ."""
    tables = [_comparisons(e) for e in pair]
    verdicts = [_verdicts(e) for e in pair]
    keys = sorted(set(tables[0]) | set(tables[1]))
    if not keys:
        return ["No metric was compared in either experiment."], []
    lines, differ = ["probe.metric: candidate median (ratio to baseline, verdict) of each:"], []
    for key in keys:
        name = _key_label(key)
        cells = [_cell(tables[i].get(key), verdicts[i].get(key)) for i in range(2)]
        changed = verdicts[0].get(key) != verdicts[1].get(key)
        if changed:
            differ.append(f"{name}: {verdicts[0].get(key, 'not compared')} -> "
                          f"{verdicts[1].get(key, 'not compared')}")
        if len(lines) <= MAX_ROWS:
            lines.append(f"- {name}: #{pair[0].pk} {cells[0]} | #{pair[1].pk} {cells[1]}"
                         + ("  <- verdict differs" if changed else ""))
    lines += _more(len(keys), MAX_ROWS, "metric rows")
    return lines, differ


def _key_label(key: Key) -> str:
    probe, variant, metric, case = key
    return (f"{probe}.{metric}" + (f" [{variant}]" if variant else "")
            + (f" case {case}" if case else ""))


def _cell(comparison: dict[str, Any] | None, verdict: str | None) -> str:
    if comparison is None:
        return "not measured"
    unit = f" {comparison['unit']}" if comparison.get("unit") else ""
    ratio = comparison.get("ratio")
    return (f"{_number(comparison.get('candidate_median'))}{unit} "
            f"(x{_number(ratio, '.3f')}, {verdict or 'not compared'})")


def _criteria_of(experiment: Experiment) -> dict[str, str]:
    """Criterion name -> its verdict in words (passed, failed, not run), with its quantity."""
    result = {}
    for finding in experiment.feedback.get("findings", []):
        if finding.get("layer") != "criteria":
            continue
        e = finding.get("evidence") or {}
        verdict = e.get("verdict") or {}
        word = ("not run" if finding.get("kind") == "criterion-not-run"
                else "passed" if verdict.get("passed") else "failed")
        quantity = verdict.get("quantity")
        ratio = (e.get("spec") or {}).get("kind") in ("relative", "relation")
        shown = "" if not isinstance(quantity, int | float) \
            else f" ({quantity:+.2%})" if ratio else f" ({quantity:.4g})"
        result[str(e.get("name") or finding.get("title"))] = word + shown
    return result


def _criteria_lines(pair: tuple[Experiment, Experiment]) -> list[str]:
    verdicts = [_criteria_of(e) for e in pair]
    names = sorted(set(verdicts[0]) | set(verdicts[1]))
    if not names:
        return ["Criteria: none judged in either experiment."]
    lines = ["Criteria:"]
    for name in names[:MAX_ROWS]:
        a, b = (v.get(name, "not judged") for v in verdicts)
        lines.append(f"- {name}: #{pair[0].pk} {a} | #{pair[1].pk} {b}")
    return lines + _more(len(names), MAX_ROWS, "criteria")


# --------------------------------------------------------------------------- case_detail


@dataclass
class _Compared:
    """What the feedback stored of one compared pair of executions ('candidate vs baseline
    [cp=on]', '[cp=on] vs [cp=off] (candidate)')."""

    label: str
    executions: list[int] = field(default_factory=list)  # [reference, candidate]
    cases: dict[str, dict[str, Any]] = field(default_factory=dict)  # case -> comparison
    notes: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    series: str = ""


@tool(
    "case_detail",
    "A correctness probe's errors per case.",
    obj({"experiment_id": _ID, "probe": _PROBE,
         "case": string("One case (an output's name without .npy/.json).", 200, minLength=1)},
        required=["experiment_id", "probe"]),
    untrusted=True, needs_run=True,
)
def _case_detail(ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
    experiment = _read(ctx, args["experiment_id"])
    name = args["probe"]
    _check_probe(experiment, name)
    if not experiment.feedback:
        raise ToolError(f"experiment {experiment.pk} is {experiment.status}: no feedback yet",
                        "Its feedback arrives at your next step; ask then.")
    compared = _compared(experiment, name)
    if not compared:
        raise ToolError(f"no per-case comparison of {name} in experiment {experiment.pk}",
                        _probes_with_cases(experiment))
    outputs = _output_cases(compared.values())
    case = args.get("case")
    known = sorted({c for entry in compared.values() for c in entry.cases}
                   | {c for cases in outputs.values() for c in cases}, key=natural_key)
    if case is not None and case not in known:
        raise ToolError(f"{name} has no case {case!r} in experiment {experiment.pk}",
                        f"Its cases: {', '.join(known[:MAX_PASSING_NAMED]) or 'none'}.")
    probe = pinned_manifest(the_run(ctx)).probe(name)
    lines = [f"{name} in experiment {experiment.pk}: {len(known)} cases; an element matches "
             "when |candidate - reference| <= atol + rtol * |reference|."]
    recomputed = 0
    for entry in sorted(compared.values(), key=lambda c: (c.label.endswith("(baseline)"),
                                                          c.label)):
        cases = outputs.get(_pair_key(entry), set()) | set(entry.cases)
        if case is not None and case not in cases:
            continue  # a comparison without this case (a 'fixed' rule's summary) says nothing
        rtol, atol = _tolerance(probe, entry.label)
        lines.append(f"{entry.label} (rtol {rtol:g}, atol {atol:g}):")
        if entry.series:
            lines.append(f"  error vs size: {entry.series[:300]}")
        if case is not None:
            stored = entry.cases.get(case)
            if stored is None and recomputed < MAX_RECOMPUTED:
                recomputed += 1
                stored = _recompute(entry, case, rtol, atol)
            lines += _case_lines(case, stored, entry.notes.get(case, []))
        else:
            lines += _cases_summary(entry, cases)
    return ToolResult(True, "\n".join(lines[:MAX_CASE_LINES] + _more(
        len(lines), MAX_CASE_LINES, "lines")), {
        "experiment": experiment.pk, "probe": name, "case": case, "cases": known[:100],
        "compared": sorted(compared)})


def _flat(findings: Iterable[dict[str, Any]]) -> Iterable[dict[str, Any]]:
    """Findings, with those a baseline note or a 'fixed' finding folded into it."""
    for finding in findings:
        yield finding
        nested = (finding.get("evidence") or {}).get("baseline")
        if isinstance(nested, list):
            yield from (f for f in nested if isinstance(f, dict))


def _compared(experiment: Experiment, probe: str) -> dict[str, _Compared]:
    """Compared label -> what the feedback stored of it, for one probe's correctness and
    integrity findings."""
    result: dict[str, _Compared] = {}
    for finding in _flat(experiment.feedback.get("findings", [])):
        e = finding.get("evidence") or {}
        label = e.get("compared")
        if e.get("probe") != probe or not isinstance(label, str) \
                or finding.get("layer") not in ("correctness", "integrity"):
            continue
        entry = result.setdefault(label, _Compared(label))
        if not entry.executions and isinstance(e.get("executions"), list):
            entry.executions = [int(pk) for pk in e["executions"][:2]]
        _note(entry, finding, e)
    return result


def _note(entry: _Compared, finding: dict[str, Any], evidence: dict[str, Any]) -> None:
    """What one finding says of its pair: its error series, or its cases (every case of a
    finding that stands for several, infraops.feedback.findings.by_root_cause)."""
    if finding.get("kind") == "error-vs-size":
        entry.series = str(finding.get("detail", ""))
        return
    series = evidence.get("series")
    if isinstance(series, dict) and series.get("detail"):  # folded into the failing cases
        entry.series = str(series["detail"])
    case = evidence.get("case")
    if not isinstance(case, str):
        return
    cases = evidence["cases"] if isinstance(evidence.get("cases"), list) else [case]
    comparisons = evidence.get("comparisons") or {case: evidence.get("comparison")}
    for one in (c for c in cases if isinstance(c, str)):
        comparison = comparisons.get(one) if isinstance(comparisons, dict) else None
        if finding.get("layer") == "correctness" and isinstance(comparison, dict):
            entry.cases[one] = comparison
        else:
            entry.notes[one].append(f"{finding.get('kind')}: {str(finding.get('detail'))[:300]}")


def _pair_key(entry: _Compared) -> tuple[int, ...]:
    return tuple(entry.executions)


def _output_cases(entries: Iterable[_Compared]) -> dict[tuple[int, ...], set[str]]:
    """Per compared pair, the cases both of its executions wrote into outputs/ (stored
    artifact names; nothing is read)."""
    pairs = [_pair_key(e) for e in entries if len(e.executions) == 2]
    ids = {pk for pair in pairs for pk in pair}
    names: dict[int, set[str]] = defaultdict(set)
    rows = Artifact.objects.filter(execution_id__in=ids, name__startswith="outputs/")
    for execution, name in rows.values_list("execution_id", "name")[:20_000]:
        case = _case_name(name)
        if case is not None:
            names[execution].add(case)
    return {pair: names[pair[0]] | names[pair[1]] for pair in pairs}


def _case_name(artifact: str) -> str | None:
    """'outputs/large.npy' -> 'large'; None for a .meta.json or anything else."""
    name = artifact.removeprefix("outputs/")
    if "/" in name or name.endswith(correctness.META_SUFFIX):
        return None
    for suffix in correctness.OUTPUT_SUFFIXES:
        if name.endswith(suffix):
            return name.removesuffix(suffix)
    return None


def _probes_with_cases(experiment: Experiment) -> str:
    probes = sorted({str((f.get("evidence") or {}).get("probe"))
                     for f in experiment.feedback.get("findings", [])
                     if (f.get("evidence") or {}).get("compared")})
    if probes:
        return f"Probes with case comparisons in this experiment: {', '.join(probes)}."
    return ("No probe of this experiment had outputs/ compared (correctness probes write "
            "outputs/<case>.npy or .json).")


def _tolerance(probe: Probe | None, label: str) -> tuple[float, float]:
    """The tolerances of the comparison `label`: its compare rule's; candidate against
    baseline uses the probe's first rule's (the manifest's defaults without one)."""
    rules = probe.compare if probe is not None else ()
    if probe is not None and not label.startswith("candidate vs baseline"):
        wanted = label.rpartition(" (")[0] or label
        for rule in rules:
            for variant in probe.variant_matrix():
                if any(variant.get(k) != v for k, v in rule.candidate.items()):
                    continue
                reference = variant_key(variant | rule.reference)
                if wanted == f"[{variant_key(variant)}] vs [{reference}]":
                    return rule.rtol, rule.atol
    return (rules[0].rtol, rules[0].atol) if rules else (DEFAULT_RTOL, DEFAULT_ATOL)


def _cases_summary(entry: _Compared, cases: set[str]) -> list[str]:
    """The failing cases with their numbers, then the passing ones by name."""
    lines = []
    failing = [c for c in sorted(cases, key=natural_key)
               if c in entry.cases and entry.cases[c].get("status") != "match"]
    for case in failing:
        lines += _case_lines(case, entry.cases[case], entry.notes.get(case, []))
    passing = [c for c in sorted(cases, key=natural_key) if c not in failing]
    if passing:
        shown = ", ".join(passing[:MAX_PASSING_NAMED])
        more = f" and {len(passing) - MAX_PASSING_NAMED} more" \
            if len(passing) > MAX_PASSING_NAMED else ""
        lines.append(f"  pass (within tolerance): {shown}{more}; name a case for its errors")
        for case in passing:
            lines += [f"  case {case} note: {n}" for n in entry.notes.get(case, [])[:2]]
    return lines


def _case_lines(case: str, comparison: dict[str, Any] | None, notes: list[str]) -> list[str]:
    """One case's verdict and numbers (comparison: CaseComparison.as_dict())."""
    if comparison is None:
        return [f"  case {case}: pass (within tolerance); its errors were not stored and could "
                "not be recomputed here"] + [f"    note: {n}" for n in notes[:3]]
    status = str(comparison.get("status"))
    verdict = "pass" if status == "match" else f"FAIL ({status})"
    text = (f"  case {case}: {verdict}; max abs error {_number(comparison.get('max_abs_error'))}"
            f", max rel error {_number(comparison.get('max_rel_error'))}")
    if comparison.get("max_ulp") is not None:
        text += f", max ulp {comparison['max_ulp']}"
    if comparison.get("shape") is not None:
        text += f"; shape {comparison['shape']}, dtype {comparison.get('dtype')}"
    if comparison.get("size") is not None:
        text += f"; size {_number(comparison['size'])}"
    lines = [text]
    if status != "match":
        first = _first_mismatch(comparison)
        detail = "" if first else f"; {str(comparison.get('detail'))[:300]}"
        lines.append(f"    {comparison.get('mismatches', 0)} elements outside tolerance"
                     f"{first}{detail}")
    return lines + [f"    note: {n}" for n in notes[:3]]


def _first_mismatch(comparison: dict[str, Any]) -> str:
    index = comparison.get("first_mismatch")
    if index is None:
        return ""
    text = f"; first mismatch at index {list(index)}"
    values = comparison.get("first_values")
    if isinstance(values, list) and len(values) == 2:
        text += f": reference {_number(values[0], '.10g')}, candidate {_number(values[1], '.10g')}"
    return text


def _recompute(entry: _Compared, case: str, rtol: float, atol: float) -> dict[str, Any] | None:
    """The comparison of one case of one pair from its stored outputs (the feedback keeps the
    numbers of mismatches only); None when the pair or its outputs are not at hand or larger
    than RECOMPUTE_MAX_BYTES."""
    if len(entry.executions) != 2:
        return None
    names = [f"outputs/{case}{suffix}" for suffix in (*correctness.OUTPUT_SUFFIXES,
                                                       correctness.META_SUFFIX)]
    found = Artifact.objects.filter(execution_id__in=entry.executions, name__in=names)
    artifacts: dict[int, list[Artifact]] = defaultdict(list)
    for artifact in found:
        artifacts[artifact.execution_id].append(artifact)
    if any(a.size > RECOMPUTE_MAX_BYTES for group in artifacts.values() for a in group):
        return None
    root = Path(settings.DATA_DIR) / "scratch"
    root.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="case-", dir=root))
    try:
        folders = [link_outputs(scratch / side, artifacts.get(pk, []))
                   for side, pk in zip(("reference", "candidate"), entry.executions, strict=True)]
        result = correctness.compare_output_dirs(folders[0], folders[1], rtol=rtol, atol=atol)
    except (OSError, ValueError):
        return None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return next((c.as_dict() for c in result if c.case == case), None)


# --------------------------------------------------------------------------- span_summary


@tool(
    "span_summary",
    "A traced span's timing and overlaps.",
    obj({"experiment_id": _ID,
         "span": string("A span name or glob, as in trace.json.", 200, minLength=1),
         "probe": _PROBE},
        required=["experiment_id", "span"]),
    untrusted=True, needs_run=True,
)
def _span_summary(ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
    experiment = _read(ctx, args["experiment_id"])
    span, probe = args["span"], args.get("probe")
    if probe is not None:
        _check_probe(experiment, probe)
    groups = _trace_groups(experiment, probe)
    if not groups:
        raise ToolError(f"no trace.json stored for {probe or 'any probe'} in experiment "
                        f"{experiment.pk}", _traced_probes(experiment))
    lines = [f"Span {span} in experiment {experiment.pk} (each side's first sample trace):"]
    seen: dict[str, float] = defaultdict(float)
    for (name, variant), executions in list(groups.items())[:MAX_TRACE_GROUPS]:
        parsed = {side: _trace(e) for side, e in executions.items()}
        for trace in parsed.values():
            for row in traces.span_stats(trace) if trace is not None else []:
                seen[row.name] += row.total_us
        lines += _group_lines(name, variant, span, parsed)
    if not any(_matches(span, n) for n in seen):
        top = sorted(seen, key=lambda n: (-seen[n], n))[:MAX_SPAN_NAMES]
        raise ToolError(f"no span {span!r} in the traces of experiment {experiment.pk}",
                        f"Spans there, longest first: {', '.join(top) or 'none'}.")
    lines += _more(len(groups), MAX_TRACE_GROUPS, "traced variants (name `probe`)")
    lines += _span_findings(experiment, span)
    return ToolResult(True, "\n".join(lines), {"experiment": experiment.pk, "span": span})


def _trace_groups(experiment: Experiment, probe: str | None
                  ) -> dict[tuple[str, str], dict[str, ProbeExecution]]:
    """(probe, variant) -> side -> the first sample execution that stored a trace.json."""
    rows = ProbeExecution.objects.filter(
        experiment=experiment, attempt=_attempt(experiment), repeat_index=0,
        artifacts__name="trace.json").prefetch_related("artifacts").order_by("id")
    if probe is not None:
        rows = rows.filter(probe=probe)
    groups: dict[tuple[str, str], dict[str, ProbeExecution]] = {}
    for execution in rows.defer("stdout", "stderr"):
        groups.setdefault((execution.probe, execution.variant), {}).setdefault(
            execution.side, execution)
    return groups


def _traced_probes(experiment: Experiment) -> str:
    traced = sorted(set(ProbeExecution.objects.filter(
        experiment=experiment, artifacts__name="trace.json").values_list("probe", flat=True)))
    if traced:
        return f"Probes with traces here: {', '.join(traced)}."
    return "None of this experiment's probes wrote a trace.json into $INFRAOPS_OUT."


def _trace(execution: ProbeExecution) -> traces.Trace | None:
    artifact = next((a for a in execution.artifacts.all() if a.name == "trace.json"), None)
    if artifact is None or artifact.size > TRACE_MAX_BYTES:
        return None
    try:
        with blob_store().open(artifact.sha256) as handle:
            return traces.parse_trace(handle.read())
    except (traces.TraceError, OSError, ValueError):
        return None


def _matches(pattern: str, name: str) -> bool:
    if set(pattern) & set("*?["):
        return fnmatch.fnmatchcase(name, pattern)
    return name == pattern


@dataclass(frozen=True)
class _SpanTotals:
    count: int
    total_us: float
    threads: tuple[tuple[str, int], ...]  # (thread label, calls)

    @property
    def mean_us(self) -> float:
        return self.total_us / self.count if self.count else 0.0


def _totals(trace: traces.Trace, span: str) -> _SpanTotals | None:
    rows = [r for r in traces.span_stats(trace) if _matches(span, r.name)]
    if not rows:
        return None
    threads: dict[str, int] = defaultdict(int)
    for row in rows:
        threads[row.thread] += row.count
    return _SpanTotals(sum(r.count for r in rows), sum(r.total_us for r in rows),
                       tuple(sorted(threads.items(), key=lambda t: -t[1])))


def _group_lines(probe: str, variant: str, span: str,
                 parsed: dict[str, traces.Trace | None]) -> list[str]:
    lines = [f"{probe} [{variant or 'default'}]:"]
    totals: dict[str, _SpanTotals | None] = {}
    for side in ("candidate", "baseline"):
        trace = parsed.get(side)
        totals[side] = _totals(trace, span) if trace is not None else None
        if trace is None:
            lines.append(f"  {side}: no readable trace")
        elif totals[side] is None:
            lines.append(f"  {side}: no {span} spans")
        else:
            lines += _side_lines(side, span, trace, totals[side])
    cand, base = totals.get("candidate"), totals.get("baseline")
    if cand is not None and base is not None and base.total_us > 0 and base.mean_us > 0:
        lines.append(f"  candidate vs baseline: total x{cand.total_us / base.total_us:.3f}, "
                     f"mean x{cand.mean_us / base.mean_us:.3f}, count {base.count} -> "
                     f"{cand.count}")
    return lines


def _side_lines(side: str, span: str, trace: traces.Trace, totals: _SpanTotals | None
                ) -> list[str]:
    assert totals is not None
    threads = ", ".join(f"{label} {calls}" for label, calls in totals.threads[:3])
    lines = [f"  {side}: {totals.count} spans, total {_duration(totals.total_us)}, mean "
             f"{_duration(totals.mean_us)} (calls by thread: {threads})"]
    overlaps = _overlaps(trace, span)
    if overlaps:
        lines.append(f"    overlapped by: {overlaps}")
    attribution = traces.idle_attribution(trace, span)
    if attribution is not None:
        lines.append(f"    idle: {attribution.detail[:500]}")
    return lines


def _overlaps(trace: traces.Trace, span: str) -> str:
    """'dispatch 61%, combine 0.0%': the share of the span's time each of the longest other
    spans was open (on any thread)."""
    totals: dict[str, float] = defaultdict(float)
    for row in traces.span_stats(trace):
        if not _matches(span, row.name):
            totals[row.name] += row.total_us
    parts = []
    for other in sorted(totals, key=lambda n: -totals[n])[:MAX_OVERLAPS]:
        result = traces.overlap(trace, span, other)
        if result.fraction is not None:
            share = f"{result.fraction:.1%}" if result.fraction < 0.1 else f"{result.fraction:.0%}"
            parts.append(f"{other} {share}")
    return ", ".join(parts)


def _span_findings(experiment: Experiment, span: str) -> list[str]:
    """The behaviour findings of the feedback about the span (changes, overlaps)."""
    found = []
    for finding in experiment.feedback.get("findings", []):
        e = finding.get("evidence") or {}
        overlap = e.get("overlap") or {}
        names = [e.get("span"), *overlap.get("a", []), *overlap.get("b", [])]
        if finding.get("layer") == "behaviour" and any(
                isinstance(n, str) and _matches(span, n) for n in names):
            found.append(f"- [{str(finding.get('severity')).upper()}] {finding.get('title')}: "
                         f"{str(finding.get('detail'))[:300]}")
    if not found:
        return []
    return ["Findings about it:", *found[:5], *_more(len(found), 5, "findings")]

