"""Cheats fail (issue 10, item 3): one planted cheat per integrity rule, in both output formats
the contract accepts (.npy arrays and JSON nested lists), run end to end through the sandbox.

The probe draws its input from INFRAOPS_SEED and writes the sorted squares of it; the
candidate commit replaces the computation with a cheat. Warm-ups run under a second seed, so
every experiment sees each side under two seeds.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from infraops import gitops
from infraops.experiments import services as experiments_service
from infraops.experiments.services import experiment_execute, experiment_request
from infraops.models import Experiment, Target
from infraops.services.targets import target_register
from reviews.gate import ProbeFact
from tests.conftest import make_origin, members_of_new_target
from tests.infraops.experiments.test_gpu_probes import end_to_end

MANIFEST = """
[[probe]]
name = "squares"
layer = "correctness"
command = "python3 bench/squares.py"
covers = ["lib/**"]
variants = {format = ["npy", "json"]}
files = ["bench/squares.py"]

[[probe]]
name = "fixed-input"
layer = "correctness"
command = "python3 bench/fixed.py"
covers = ["lib/**"]
files = ["bench/fixed.py"]

[[probe]]
name = "speed"
layer = "performance"
command = "python3 -S bench/speed.py"
covers = ["lib/**"]
metrics = ["step_ms"]
repeat = 5
files = ["bench/speed.py"]
"""

PROBE = """
import json, os, random, sys
sys.path.insert(0, ".")
from lib.squares import squares
seed = int(os.environ["INFRAOPS_SEED"])
out = os.path.join(os.environ["INFRAOPS_OUT"], "outputs")
os.makedirs(out, exist_ok=True)
for case, n in (("small", 16), ("large", 64)):
    rng = random.Random(seed * 7 + n)
    values = [rng.uniform(-1, 1) for _ in range(n)]
    result = squares(values, seed)
    if os.environ["FORMAT"] == "json":
        json.dump({"size": n, "values": [[v] for v in result]},
                  open(os.path.join(out, case + ".json"), "w"))
    else:  # the size comes with the case's metrics
        import numpy
        numpy.save(os.path.join(out, case + ".npy"), numpy.asarray(result))
        with open(os.path.join(os.environ["INFRAOPS_OUT"], "metrics.jsonl"), "a") as metrics:
            metrics.write(json.dumps({"name": "elements", "value": n, "case": case,
                                      "labels": {"size": n}}) + chr(10))
"""

# Ignores the seed; the baseline's parallel-sum model adds noise in the last bits run to run.
FIXED = """
import json, os, sys
sys.path.insert(0, ".")
from lib.squares import total
out = os.path.join(os.environ["INFRAOPS_OUT"], "outputs")
os.makedirs(out, exist_ok=True)
json.dump([total([i / 7 for i in range(n)]) for n in (10, 100, 1000)],
          open(os.path.join(out, "sums.json"), "w"))
"""

SPEED = """
import json, os, sys, time
sys.path.insert(0, ".")
from lib.squares import work
started = time.perf_counter()
work()
ms = (time.perf_counter() - started) * 1000
open(os.environ["INFRAOPS_OUT"] + "/metrics.jsonl", "w").write(
    json.dumps({"name": "step_ms", "value": ms, "unit": "ms"}) + "\\n")
"""

HONEST = """
import random
import time


def total(values):
    return sum(values) * (1 + random.SystemRandom().uniform(-1e-13, 1e-13))


def squares(values, seed):
    return sorted(v * v for v in values)


def work():
    time.sleep(0.25)
"""

CHEATS = {
    # The computation is skipped: every output is zero.
    "zeros": HONEST.replace("return sorted(v * v for v in values)",
                            "return [0.0] * len(values)"),
    # The answer is computed once and replayed: it ignores the input from then on.
    "cached": HONEST.replace(
        "    return sorted(v * v for v in values)",
        "    import json, os\n"
        "    path = f'/work/.cache-{len(values)}.json'\n"
        "    if os.path.exists(path):\n"
        "        return json.load(open(path))\n"
        "    result = sorted(v * v for v in values)\n"
        "    json.dump(result, open(path, 'w'))\n"
        "    return result"),
    # Right only for the inputs it was tried on (even seeds here).
    "one-seed": HONEST.replace(
        "    return sorted(v * v for v in values)",
        "    result = sorted(v * v for v in values)\n"
        "    return result if seed % 2 == 0 else [r * 1.5 + 0.1 for r in result]"),
    # Does the work once and remembers it in its checkout: every later execution is "faster".
    "memo": HONEST.replace(
        "    time.sleep(0.25)",
        "    import os\n"
        "    if os.path.exists('/work/.done'):\n"
        "        time.sleep(0.1)\n"
        "        return\n"
        "    time.sleep(0.25)\n"
        "    open('/work/.done', 'w').close()"),
    # A 25x "speed-up" that stopped doing the work.
    "no-work": HONEST.replace("time.sleep(0.25)", "time.sleep(0.01)"),
}


class _Seeds:
    """random.SystemRandom stand-in: the main seed is even, the warm-ups' odd."""

    def randrange(self, *args: int) -> int:
        return 1000 if args == (2**31,) else 0


@pytest.fixture
def squares_target(db: None, tmp_path: Path) -> Target:
    source = tmp_path / "squares-src"
    (source / "bench").mkdir(parents=True)
    (source / "lib").mkdir()
    (source / "infraops.toml").write_text(MANIFEST)
    (source / "bench" / "squares.py").write_text(PROBE)
    (source / "bench" / "speed.py").write_text(SPEED)
    (source / "bench" / "fixed.py").write_text(FIXED)
    (source / "lib" / "__init__.py").write_text("")
    (source / "lib" / "squares.py").write_text(HONEST)
    origin = make_origin(tmp_path, source, "squares.git")
    return members_of_new_target(
        target_register(name="squares", repo_url=str(origin), base_branch="main"))


def cheat_commit(target: Target, tmp_path: Path, cheat: str) -> str:
    tree = tmp_path / f"cheat-{cheat}"
    gitops.worktree_add(target.clone_path, tree, target.manifest_commit)
    (tree / "lib" / "squares.py").write_text(CHEATS[cheat])
    sha = gitops.commit_all(tree, f"cheat: {cheat}", author_name="t", author_email="t@t")
    gitops.worktree_remove(target.clone_path, tree)
    assert sha is not None
    return sha


def run(target: Target, candidate: str, probe: str) -> Experiment:
    experiment = experiment_request(target=target, candidate_commit=candidate,
                                    baseline_commit=target.manifest_commit, probes=[probe])
    result = experiment_execute(experiment_id=experiment.pk, worker="integrity:1")
    assert result is not None and result.status == Experiment.Status.SUCCEEDED, (
        result and result.failure_reason)
    return result


def failing(experiment: Experiment, kind: str) -> list[dict[str, Any]]:
    return [f for f in experiment.feedback["findings"]
            if f["kind"] == kind and f["severity"] == "fail"]


@pytest.mark.parametrize(("cheat", "kind", "detail"), [
    ("zeros", "degenerate-output", r"numbers are all zero while the reference's vary"),
    ("cached", "hard-coded-output",
     r"changes between seed \d+ and seed \d+ but the candidate's is byte for byte the same"),
    ("one-seed", "matches-one-seed", r"matches under seed 1000 but not under seed 1001"),
])
def test_each_output_cheat_fails_in_both_formats(
    squares_target: Target, tmp_path: Path, django_capture_on_commit_callbacks: Any,
    monkeypatch: pytest.MonkeyPatch, cheat: str, kind: str, detail: str,
) -> None:
    monkeypatch.setattr(experiments_service.random, "SystemRandom", _Seeds)
    candidate = cheat_commit(squares_target, tmp_path, cheat)
    with django_capture_on_commit_callbacks(execute=False):
        experiment = run(squares_target, candidate, "squares")

    found = failing(experiment, kind)
    formats = {f["evidence"]["compared"] for f in found}
    assert formats == {"candidate vs baseline [format=npy]",
                       "candidate vs baseline [format=json]"}, experiment.feedback["agent_text"]
    assert all(re.search(detail, f["detail"]) for f in found), found[0]["detail"]
    assert {f["layer"] for f in found} == {"integrity"}
    if cheat == "cached":  # and the cache it left in its checkout is named
        [left] = failing(experiment, "left-behind")
        assert left["evidence"]["files"] == [".cache-16.json", ".cache-64.json"]
    # A correctness probe declares no metrics; each case's size came with the case (a JSON
    # field, a metrics label), so the error is plotted against size in both formats.
    sized = {s["label"]: [p[0] for p in s["points"]] for s in experiment.feedback["series"]}
    assert sized["candidate vs baseline [format=json]"] == [16, 64]
    assert sized["candidate vs baseline [format=npy]"] == [16, 64]
    assert experiment.feedback["verdict"].startswith(f"{experiment.feedback['counts']['fail']} "
                                                     "failing")
    # Every execution's seed is stored, and the reproducing command is on the page.
    assert not experiment.executions.filter(seed__isnull=True).exists()


def test_an_honest_change_raises_no_integrity_finding(
    squares_target: Target, tmp_path: Path, django_capture_on_commit_callbacks: Any,
) -> None:
    tree = tmp_path / "honest"
    gitops.worktree_add(squares_target.clone_path, tree, squares_target.manifest_commit)
    (tree / "lib" / "squares.py").write_text(HONEST.replace(
        "return sorted(v * v for v in values)", "return sorted([v * v for v in values])"))
    sha = gitops.commit_all(tree, "a refactor", author_name="t", author_email="t@t")
    assert sha is not None
    with django_capture_on_commit_callbacks(execute=False):
        experiment = run(squares_target, sha, "squares")

    integrity = [f for f in experiment.feedback["findings"] if f["layer"] == "integrity"]
    assert integrity == [], integrity
    assert not [f for f in experiment.feedback["findings"] if f["severity"] == "fail"]
    # A correctness probe may write no metrics.jsonl: nothing nags about it.
    assert not experiment.executions.filter(detail__contains="metrics.jsonl").exists()
    # The bit-identical "not exercised" warning is gone: identical outputs are what a
    # refactor should give.
    assert not [f for f in experiment.feedback["findings"] if f["kind"] == "identical-outputs"]


def test_a_candidate_that_caches_results_in_its_checkout_fails(
    squares_target: Target, tmp_path: Path, django_capture_on_commit_callbacks: Any,
) -> None:
    candidate = cheat_commit(squares_target, tmp_path, "memo")
    with django_capture_on_commit_callbacks(execute=False):
        experiment = run(squares_target, candidate, "speed")

    # A 2.5x "improvement" within the plausibility bound: only what it left behind tells.
    [faster] = [f for f in experiment.feedback["findings"] if f["kind"] == "perf-comparison"
                and f["evidence"]["comparison"]["verdict"] == "improved"]
    [left] = failing(experiment, "left-behind")
    assert left["evidence"]["files"] == [".done"]
    assert "replay them" in left["detail"]
    # The speed-up is the cheat's: no passing finding, no gain confirmed for the gate.
    assert (faster["severity"], faster["title"]) == ("warn", "speed step_ms not credited")
    assert faster["detail"].startswith("not credited: the candidate fails 1 integrity check "
                                       "(first: the candidate left 1 files")
    assert not [f for f in experiment.feedback["findings"]
                if f["layer"] == "performance" and f["severity"] == "pass"]
    confirmed = end_to_end(experiment, ProbeFact("speed", "performance", 1))
    assert not confirmed.passed and confirmed.detail.startswith("no gain is credited: speed "
                                                                "step_ms not credited")


def test_a_fix_that_makes_noisy_outputs_deterministic_is_not_called_hard_coded(
    squares_target: Target, tmp_path: Path, django_capture_on_commit_callbacks: Any,
) -> None:
    # The reference moves between runs only in its last bits (within tolerance); the seed
    # does not drive it: the candidate's identical outputs are what a determinism fix gives.
    tree = tmp_path / "deterministic"
    gitops.worktree_add(squares_target.clone_path, tree, squares_target.manifest_commit)
    source = (tree / "lib" / "squares.py").read_text()
    (tree / "lib" / "squares.py").write_text(source.replace(
        "return sum(values) * (1 + random.SystemRandom().uniform(-1e-13, 1e-13))",
        "return sum(values)"))
    sha = gitops.commit_all(tree, "deterministic sum", author_name="t", author_email="t@t")
    assert sha is not None
    with django_capture_on_commit_callbacks(execute=False):
        experiment = run(squares_target, sha, "fixed-input")

    assert not [f for f in experiment.feedback["findings"] if f["severity"] == "fail"], (
        experiment.feedback["agent_text"])


def test_a_speed_up_beyond_the_plausibility_bound_fails(
    squares_target: Target, tmp_path: Path, django_capture_on_commit_callbacks: Any,
) -> None:
    candidate = cheat_commit(squares_target, tmp_path, "no-work")
    with django_capture_on_commit_callbacks(execute=False):
        experiment = run(squares_target, candidate, "speed")

    [implausible] = failing(experiment, "too-good-to-be-true")
    assert re.search(r"step_ms \d+(\.\d+)?x better: implausible", implausible["title"])
    assert "plausibility bound of 5x" in implausible["detail"]
    # ... and the speed-up itself is not credited.
    assert [f["title"] for f in experiment.feedback["findings"]
            if f["kind"] == "perf-comparison"] == ["speed step_ms not credited"]


def test_the_page_shows_each_executions_seed_and_how_to_reproduce_it(
    squares_target: Target, tmp_path: Path, django_capture_on_commit_callbacks: Any,
    client: Any, viewer: Any,
) -> None:
    candidate = cheat_commit(squares_target, tmp_path, "zeros")
    with django_capture_on_commit_callbacks(execute=False):
        experiment = run(squares_target, candidate, "squares")
    execution = experiment.executions.get(side="candidate", variant="format=json",
                                          repeat_index=0)
    client.force_login(viewer)

    page = client.get(f"/experiments/{experiment.pk}/").content.decode()

    assert f"INFRAOPS_SEED={execution.seed}" in page
    assert f"git checkout {candidate[:12]}" in page and "FORMAT=json" in page
    assert "warm-up" in page and "never a sample" in page
    assert "<strong>Execution:</strong> all probes ran" in page
    assert "<strong>Verdict:</strong>" in page

