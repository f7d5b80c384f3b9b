"""Changes on the example target, made with real commits in InfraOps' clone."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from infraops import gitops
from infraops.feedback.criteria import CRITERION_KEYS
from infraops.models import Boundary, Experiment, Goal, GoalVersion, Target
from infraops.services.goals import goal_snapshot
from reviews.models import Change
from reviews.services import change_submit
from tests.factories import ExperimentFactory

AUTHOR = {"author_name": "InfraOps agent", "author_email": "agent@example.test"}

CommitOn = Callable[..., tuple[str, str]]


@pytest.fixture
def commit_on(example_target: Target, tmp_path: Path) -> CommitOn:
    """commit_on({path: text}) commits the files on top of the clone's main tip (or of the
    commit `on`), not moving main, and returns (base, head)."""
    made = 0

    def commit(files: dict[str, str], on: str | None = None) -> tuple[str, str]:
        nonlocal made
        made += 1
        repo = example_target.clone_path
        base = on or gitops.rev_parse(repo, f"refs/heads/{example_target.base_branch}")
        tree = tmp_path / f"worktree-{made}"
        gitops.worktree_add(repo, tree, base)
        for name, text in files.items():
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            (tree / name).write_text(text)
        head = gitops.commit_all(tree, f"candidate {made}", **AUTHOR)
        gitops.worktree_remove(repo, tree)
        assert head is not None
        return base, head

    return commit


SERVING_TOML = "# Serving configuration of the tiny engine.\nbatch_size = 8\nmax_queue = 256\n"


@pytest.fixture
def config_change(example_target: Target, engineer: User, commit_on: CommitOn) -> Change:
    """A pending change of config/serving.toml (production risk by the example manifest),
    written by a run that `engineer` started."""
    base, head = commit_on({"config/serving.toml": SERVING_TOML})
    return change_submit(
        target=example_target, title="Tune batch_size=8", hypothesis="Bigger batches amortise.",
        evidence={}, base_commit=base, head_commit=head, author_label="run 1",
        requested_by=engineer, goal_version=None, experiment=None,
    )


def criterion_finding(spec: dict[str, Any], *, passed: bool = True,
                      detail: str = "candidate vs baseline -8.00% (95% CI -10.0% to -6.0%)"
                      ) -> dict[str, Any]:
    """A criteria finding as infraops.experiments.analysis records it."""
    measured = {k: spec.get(k) for k in CRITERION_KEYS}
    return {"layer": "criteria", "kind": "criterion", "severity": "pass" if passed else "fail",
            "title": spec["description"], "detail": detail, "specificity": 20,
            "evidence": {"probe": spec["probe"], "metric": spec["metric"],
                         "criterion": spec["id"], "spec": measured,
                         "verdict": {"passed": passed, "detail": detail}}}


def perf_finding(probe: str, metric: str, verdict: str = "improved",
                 detail: str = "ratio 0.900 (95% CI 0.880-0.920)") -> dict[str, Any]:
    severity = {"improved": "pass", "regressed": "fail", "no change": "info"}.get(verdict, "warn")
    return {"layer": "performance", "kind": "perf-comparison", "severity": severity,
            "title": f"{probe} {metric} {verdict}", "detail": detail, "specificity": 20,
            "evidence": {"probe": probe, "metric": metric, "comparison": {"verdict": verdict}}}


def make_evidence(target: Target, base: str, head: str, findings: list[dict[str, Any]], *,
                  probes: tuple[str, ...] = ("latency-bench",),
                  status: str = "succeeded") -> Experiment:
    """A finished experiment of head against base with these findings (as analysis stores)."""
    return ExperimentFactory.create(
        target=target, status=status, candidate_commit=head, baseline_commit=base,
        probes=list(probes), finished_at=timezone.now(),
        feedback={"findings": findings, "counts": {}, "agent_text": ""})


@pytest.fixture
def auto_goal(example_goal: Goal, engineer: User) -> GoalVersion:
    """The example goal with automatic merge on: its latest version."""
    Goal.objects.filter(pk=example_goal.pk).update(auto_merge=True)
    Boundary.objects.filter(goal=example_goal).update(editable_paths="config/**\nserving/**")
    example_goal.refresh_from_db()
    return goal_snapshot(goal=example_goal, user=engineer)


ENGINE_EDIT = {"serving/engine.py": (Path(__file__).resolve().parents[2] / "examples" /
                                     "tiny-serving" / "serving" / "engine.py").read_text()
               .replace("PER_REQUEST = 500", "PER_REQUEST = 375")}


@pytest.fixture
def passing_submit(example_target: Target, auto_goal: GoalVersion, engineer: User,
                   commit_on: CommitOn) -> Callable[..., Change]:
    """Submit a plain code change whose evidence passes every gate check (overridable)."""

    def submit(files: dict[str, str] | None = None,
               findings: list[dict[str, Any]] | None = None, on: str | None = None,
               **overrides: Any) -> Change:
        base, head = commit_on(files or ENGINE_EDIT, on)
        spec = auto_goal.spec["criteria"][0]
        found = findings if findings is not None else [
            criterion_finding(spec), perf_finding("latency-bench", "latency_ms")]
        experiment = make_evidence(example_target, base, head, found)
        arguments: dict[str, Any] = {
            "target": example_target, "title": "Cheaper requests",
            "hypothesis": "Less work per request lowers latency.", "evidence": {},
            "base_commit": base, "head_commit": head, "author_label": "run 4",
            "requested_by": engineer, "goal_version": auto_goal, "experiment": experiment}
        return change_submit(**(arguments | overrides))

    return submit


@contextmanager
def origin_moved(target: Target, tmp_path: Path) -> Iterator[str]:
    """Inside the block the origin's main is one commit ahead of where InfraOps cloned it
    (so a push is refused as non-fast-forward); after it, main is back where it was."""
    origin = Path(target.repo_url)
    before = gitops.rev_parse(origin, "refs/heads/main")
    tree = tmp_path / "upstream-work"
    gitops.worktree_add(origin, tree, before)
    (tree / "README.md").write_text("Pushed upstream meanwhile.\n")
    upstream = gitops.commit_all(tree, "upstream", author_name="U", author_email="u@example.test")
    gitops.worktree_remove(origin, tree)
    assert upstream is not None
    gitops.branch_move(origin, "main", new=upstream, old=before)
    try:
        yield upstream
    finally:
        gitops.branch_move(origin, "main", new=before, old=upstream)
