"""Real instruction-count experiments for bench/feedback_stats.py and
tests/infraops/test_instruction_counts.py: a small target repository whose one probe runs a
pure-Python CPU kernel under callgrind (`measure = "instructions"`), committed candidates, and
readers for what an experiment recorded (verdict, per-execution counts, warm-up counts).

Import it after Django is set up (it imports the models). Every experiment goes through the
product's real path: `experiment_execute` claims it, exports fresh checkouts of both commits,
runs every execution sandboxed (bubblewrap) under valgrind, stores samples and artifacts, and
builds the feedback. Rows must be committed (the lease heartbeat renews on its own connection):
run it outside a transaction, or in a `transaction=True` test.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from django.conf import settings
from django.db import connection

from infraops import gitops
from infraops.experiments.services import CALLGRIND_PREFIX, experiment_execute, worker_name
from infraops.feedback.stats import first_run_outlier, parse_callgrind_total
from infraops.models import Experiment, ProbeExecution, Sample, Target
from infraops.services.targets import target_register

PROBE = "count"
METRIC = "instructions"
KERNEL = "kernel/work.py"
BASE_ITERATIONS = 1000
PLANTED_RATIO = 1.015
COMMAND = "python3 -S bench/count.py"
# The sandbox's PATH: the calibration runs the same python3 the probe gets.
SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"

# extra_repeats = 0: an experiment decides with the repeats its manifest states (the extra
# repeats an inconclusive comparison may take are measured by bench/feedback_stats.py's
# synthetic figures), so "called regressed at 5 repeats a side" means five.
MANIFEST = """# A pure-Python CPU kernel counted under callgrind.

[[probe]]
name = "count"
layer = "performance"
command = "{command}"
metrics = ["instructions"]
measure = "instructions"
repeat = {repeat}
extra_repeats = 0
timeout = 120
covers = ["kernel/**"]
files = ["bench/count.py"]
"""

# -S: no site import (11 M of the 31 M instructions of `python3 -c pass` here, and it reads
# the host's site-packages). The kernel is imported, so a fresh checkout's first run compiles it.
PROBE_SCRIPT = """import os
import sys

sys.path.insert(0, os.getcwd())
from kernel import work

work.run()
open(os.environ["INFRAOPS_OUT"] + "/metrics.jsonl", "w").close()
"""

KERNEL_SOURCE = '''"""ITERATIONS rounds of the same pure-Python body: the work the probe counts."""

ITERATIONS = {iterations}
INNER = 8


def body(x, j):
    return (x * 1103515245 + j) & 0xFFFFFFFF


def run():
    acc = 0
    for _ in range(ITERATIONS):
        for j in range(INNER):
            acc = body(acc, j)
    return acc
'''

_ITERATIONS_RE = re.compile(r"(?m)^ITERATIONS = \d+$")
_REPEAT_RE = re.compile(r"(?m)^repeat = \d+$")


def write_source(folder: Path, *, repeat: int = 5, iterations: int = BASE_ITERATIONS) -> Path:
    """The target repository's files in `folder` (created); returns it."""
    (folder / "bench").mkdir(parents=True)
    (folder / "kernel").mkdir()
    (folder / "infraops.toml").write_text(MANIFEST.format(repeat=repeat, command=COMMAND))
    (folder / "bench" / "count.py").write_text(PROBE_SCRIPT)
    (folder / "kernel" / "__init__.py").write_text("")
    (folder / KERNEL).write_text(KERNEL_SOURCE.format(iterations=iterations))
    return folder


Edit = Callable[[str], str]


def set_iterations(iterations: int) -> Edit:
    """An edit of the kernel: its loop runs `iterations` times."""

    def edit(text: str) -> str:
        assert _ITERATIONS_RE.search(text), "the kernel has no ITERATIONS line"
        return _ITERATIONS_RE.sub(f"ITERATIONS = {iterations}", text)

    return edit


def set_repeat(repeat: int) -> Edit:
    """An edit of infraops.toml: the probe repeats `repeat` times a side."""

    def edit(text: str) -> str:
        assert _REPEAT_RE.search(text), "the manifest has no repeat line"
        return _REPEAT_RE.sub(f"repeat = {repeat}", text)

    return edit


def add_comment(comment: str) -> Edit:
    """A comment-only edit: the code (and its bytecode) stays identical."""
    return lambda text: text + f"# {comment}\n"


@dataclass(frozen=True)
class Calibration:
    """Instructions of one probe run outside the sandbox: fixed + per_iteration * ITERATIONS."""

    fixed: float
    per_iteration: float

    def iterations_for(self, ratio: float, base: int = BASE_ITERATIONS) -> int:
        """Kernel iterations that make a whole run count `ratio` times a run of `base`."""
        total = self.fixed + self.per_iteration * base
        return round((ratio * total - self.fixed) / self.per_iteration)


def callgrind_count(tree: Path, command: str) -> int:
    """Instructions of `command` run in `tree` under callgrind as the runner does it
    (children traced, every process's file summed), outside the sandbox."""
    with tempfile.TemporaryDirectory(prefix="calibrate-out-") as out:
        env = {"PATH": SANDBOX_PATH, "HOME": out, "LANG": "C.UTF-8", "INFRAOPS_OUT": out}
        subprocess.run(
            ["valgrind", "--tool=callgrind", "--trace-children=yes", "--quiet",
             f"--callgrind-out-file={out}/{CALLGRIND_PREFIX}%p.out", "/bin/sh", "-c", command],
            cwd=tree, env=env, check=True, capture_output=True, timeout=120)
        return sum(parse_callgrind_total(path.read_text())
                   for path in Path(out).glob(f"{CALLGRIND_PREFIX}*.out"))


def calibrate(base: int = BASE_ITERATIONS) -> Calibration:
    """Counts the probe at 0 and `base` iterations, the two in parallel. Each is run twice in
    its tree and the second run counted: with the kernel's bytecode cached, like a measured
    execution after its warm-up."""

    def count(iterations: int) -> int:
        with tempfile.TemporaryDirectory(prefix="calibrate-") as tmp:
            tree = write_source(Path(tmp) / "src", iterations=iterations)
            callgrind_count(tree, COMMAND)
            return callgrind_count(tree, COMMAND)

    with ThreadPoolExecutor(max_workers=2) as pool:
        empty, full = pool.map(count, (0, base))
    return Calibration(fixed=float(empty), per_iteration=(full - empty) / base)


def make_target(name: str, *, repeat: int = 5) -> Target:
    """Register a target from a fresh repository (its origin lives in the data folder)."""
    root = Path(settings.DATA_DIR) / "bench-sources" / name
    source = write_source(root / "src", repeat=repeat)
    origin = root / "origin.git"
    gitops.repo_init_from_dir(source, origin, branch="main", message="instruction-count target")
    return target_register(name=name, repo_url=str(origin), base_branch="main",
                           trusted_roots=[root])


def commit_change(target: Target, parent: str, edits: dict[str, Edit],
                  message: str) -> str:
    """A commit on top of `parent` applying each edit (path -> a function of its text)."""
    tree = Path(tempfile.mkdtemp(prefix="edit-", dir=Path(target.clone_path).parent))
    tree.rmdir()
    gitops.worktree_add(target.clone_path, tree, parent)
    try:
        for path, edit in edits.items():
            file = tree / path
            file.write_text(edit(file.read_text()))
        sha = gitops.commit_all(tree, message, author_name="bench", author_email="bench@infraops")
    finally:
        gitops.worktree_remove(target.clone_path, tree)
    assert sha is not None, f"{message}: nothing changed"
    return sha


def run_experiment(target: Target, baseline: str, candidate: str, *,
                   worker: str | None = None) -> Experiment:
    """One real experiment of the count probe, run here to the end (nothing is queued)."""
    changed = gitops.changed_paths(target.clone_path, baseline, candidate)
    experiment = Experiment.objects.create(
        target=target, candidate_commit=candidate, baseline_commit=baseline, probes=[PROBE],
        changed_paths=changed, manifest_sha256=target.manifest_sha256)
    result = experiment_execute(experiment_id=experiment.pk, worker=worker or worker_name())
    if result is None or result.status != Experiment.Status.SUCCEEDED:
        reason = result.failure_reason if result else "not run"
        raise RuntimeError(f"experiment {experiment.pk} did not succeed: {reason}")
    return result


def run_experiments(jobs: Sequence[tuple[Target, str, str]], *, workers: int = 2
                    ) -> list[Experiment]:
    """run_experiment for each (target, baseline, candidate), `workers` at a time (threads,
    each with its own database connection); instruction counts do not depend on the load."""

    def one(job: tuple[Target, str, str]) -> Experiment:
        try:
            return run_experiment(*job)
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(one, jobs))


def instruction_comparison(experiment: Experiment) -> dict[str, Any]:
    """The comparison behind the experiment's perf-comparison finding on instructions."""
    for finding in experiment.feedback.get("findings", []):
        evidence = finding.get("evidence", {})
        if finding.get("kind") == "perf-comparison" and evidence.get("metric") == METRIC:
            comparison: dict[str, Any] = evidence["comparison"]
            return comparison
    raise LookupError(f"experiment {experiment.pk} has no perf-comparison on {METRIC}: "
                      f"{experiment.feedback.get('agent_text', '')[:500]}")


def verdict(experiment: Experiment) -> str:
    return str(instruction_comparison(experiment)["verdict"])


def attempt_executions(experiment: Experiment) -> list[ProbeExecution]:
    return list(ProbeExecution.objects.filter(experiment=experiment,
                                              attempt=experiment.attempts, probe=PROBE)
                .order_by("pk"))


def measured_counts(experiment: Experiment) -> dict[str, list[float]]:
    """Per side, the instruction count of every measured execution (its one Sample), in the
    order they ran, a first-run outlier included (the comparison leaves it out). Warm-ups, when
    a probe asks for them, have no Sample rows."""
    counts: dict[str, list[float]] = {"baseline": [], "candidate": []}
    rows = (Sample.objects.filter(execution__experiment=experiment,
                                  execution__attempt=experiment.attempts, probe=PROBE,
                                  metric=METRIC, execution__repeat_index__gte=0)
            .order_by("execution_id").values_list("side", "value"))
    for side, value in rows:
        counts[side].append(value)
    return counts


def kept_counts(experiment: Experiment, repeat: int) -> dict[str, list[float]]:
    """Per side, the counts the comparison reads: the first `repeat` measured ones, after a
    first-run outlier among them is left out (feedback.stats.sequential_compare)."""
    kept = {}
    for side, counts in measured_counts(experiment).items():
        first_left_out = first_run_outlier(counts[:repeat])
        kept[side] = counts[1:repeat + 1] if first_left_out else counts[:repeat]
    return kept


def first_run_excess(experiment: Experiment) -> dict[str, float]:
    """Per side, how much more its first measured execution counted than the median of its
    other samples, in percent: what a fresh checkout's first run pays (it compiles the
    kernel's bytecode), now found in the samples rather than paid by a warm-up."""
    excess = {}
    for side, counts in measured_counts(experiment).items():
        if len(counts) > 1:
            excess[side] = (counts[0] / float(np.median(counts[1:])) - 1) * 100
    return excess


def delete_targets(names: list[str]) -> None:
    """Remove what the bench stored for these targets (experiments first: they protect it)."""
    targets = Target.objects.filter(name__in=names)
    Experiment.objects.filter(target__in=targets).delete()
    targets.delete()


def env_ready() -> str | None:
    """Why real instruction-count experiments cannot run here, or None."""
    from infraops.experiments.sandbox import sandbox_check

    if shutil.which("valgrind", path=SANDBOX_PATH) is None:
        return "valgrind is not installed"
    if shutil.which("python3", path=SANDBOX_PATH) is None:
        return f"no python3 on the sandbox's PATH ({SANDBOX_PATH})"
    return sandbox_check()
