"""Hostile patches (reliability rows G1, G2). Prints `figure: <name> <value> <unit>` lines.

    .venv/bin/python bench/hostile_patches.py [--smoke]

- huge_diff_reject_ms: median wall time of `reviews.diff_policy.check_diff` refusing a
  generated diff of 10,000 files and over 50 MiB (7 runs);
- huge_diff_reject_peak_mib: the most memory check_diff allocated while refusing it
  (tracemalloc's peak, the diff's own text not counted);
- hostile_patches_refused: cases of the corpus in tests/reviews/test_hostile_patches.py that
  check_diff refuses, or passes and routes to review where the corpus says so, of all cases;
- hostile_patches_routed_to_review: how many of them the corpus routes rather than refuses;
- hostile_files_changed_outside: entries of the folder holding the worktree (the worktree,
  the repository's git folder and a canary folder beside them; listing, mtime, size, mode)
  that differ after every case went through the agent's own apply_diff tool.
Targets (G1, G2): < 2000 ms; < 200 MiB; every case; 0. Exits 1 if one is missed.

--smoke: a huge diff of 100 files (about half a MiB), refused once; the whole corpus as
always. It shows that the bench runs: a missed target is said, not judged (exit 0).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import django

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# The agent's tools import models: Django is set up first. No database is touched, so a
# throw-away key is enough when none is set.
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "infraops.project.settings")
os.environ.setdefault("SECRET_KEY", "bench-hostile-patches-not-a-service")
django.setup()

from agents.tools import ToolContext, tool_call  # noqa: E402
from infraops import gitops  # noqa: E402
from reviews.diff_policy import Policy, check_diff, review_reasons  # noqa: E402
from tests.reviews.test_hostile_patches import (  # noqa: E402
    BASE_FILES,
    HOSTILE,
    OPEN,
    OUTSIDE,
    many_files,
    snapshot,
)

HUGE_FILES = 10_000
HUGE_BYTES = 50 * 2**20  # the diff of HUGE_FILES files is over this
RUNS = 7
SMOKE_FILES = 100
TARGET_MS = 2000
TARGET_MIB = 200


def figure(name: str, value: float | str, unit: str) -> None:
    shown = f"{value:.4g}" if isinstance(value, float) else value
    print(f"figure: {name} {shown} {unit}", flush=True)


def huge_diff_figures(files: int = HUGE_FILES, runs: int = RUNS) -> tuple[float, float]:
    """(median ms, peak MiB) of check_diff refusing the huge diff."""
    diff = many_files(files, lines=90, width=59)
    assert len(diff) > HUGE_BYTES * files // HUGE_FILES
    policy = Policy(editable=["docs/**"], protected=[], forbidden_patterns=["x"],
                    max_diff_lines=400)
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        refused = check_diff(diff, policy)
        times.append((time.perf_counter() - started) * 1000)
        assert refused, "the huge diff was not refused"
    tracemalloc.start()
    check_diff(diff, policy)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return statistics.median(times), peak / 2**20


def corpus_outcomes() -> int:
    """Cases check_diff handles as the corpus specifies."""
    handled = 0
    for hostile in HOSTILE.values():
        diff = hostile.diff.replace(OUTSIDE, "/srv/outside")
        refused = check_diff(diff, OPEN, existing=BASE_FILES)
        if hostile.routed:
            handled += not refused and bool(review_reasons(diff))
        else:
            handled += any(hostile.expected.replace(OUTSIDE, "/srv/outside") in str(v)
                           for v in refused)
    return handled


def changed_outside() -> int:
    """Entries of the worktree's parent folder that changed while every case went through
    apply_diff, each on a fresh worktree."""
    changed = 0
    with tempfile.TemporaryDirectory(prefix="infraops-hostile-") as tmp:
        parent = Path(tmp)
        seed = parent / "seed"
        for name, text in BASE_FILES.items():
            (seed / name).parent.mkdir(parents=True, exist_ok=True)
            (seed / name).write_text(text)
        repo = parent / "repo.git"
        base = gitops.repo_init_from_dir(seed, repo, branch="main", message="base")
        outside = parent / "outside"
        outside.mkdir()
        (outside / "secret.txt").write_text("API_KEY=sk-outside\n")
        for number, hostile in enumerate(HOSTILE.values()):
            worktree = parent / f"run-{number}"
            gitops.worktree_add(repo, worktree, base)
            ctx = ToolContext(worktree=worktree, policy=OPEN, base_commit=base)
            before = snapshot(parent)
            diff = hostile.diff.replace(OUTSIDE, str(outside))
            result = tool_call(ctx, "apply_diff", json.dumps({"diff": diff}))
            after = snapshot(parent)
            changed += result.ok + sum(after.get(k) != v for k, v in before.items())
            changed += len(set(after) - set(before))
    return changed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true",
                        help=f"a huge diff of {SMOKE_FILES} files, refused once; exits 0")
    args = parser.parse_args()
    reject_ms, peak_mib = (huge_diff_figures(SMOKE_FILES, 1) if args.smoke
                           else huge_diff_figures())
    figure("huge_diff_reject_ms", reject_ms, "ms")
    figure("huge_diff_reject_peak_mib", peak_mib, "MiB")
    handled = corpus_outcomes()
    figure("hostile_patches_refused", f"{handled}/{len(HOSTILE)}", "cases")
    figure("hostile_patches_routed_to_review", float(sum(h.routed for h in HOSTILE.values())),
           "cases")
    outside = changed_outside()
    figure("hostile_files_changed_outside", float(outside), "entries")
    missed = (reject_ms >= TARGET_MS or peak_mib >= TARGET_MIB or handled != len(HOSTILE)
              or outside != 0)
    if missed and args.smoke:
        print("targets missed (not judged in smoke mode)", file=sys.stderr)
        return 0
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
