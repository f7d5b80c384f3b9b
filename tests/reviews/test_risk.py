"""reviews.risk.classify on real unified diffs: which changed lines are risky, and why."""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest

from infraops import gitops
from infraops.manifest import RiskRule, parse_manifest
from reviews.risk import (
    BUILTIN_RULES,
    CONCURRENCY,
    NUMERICS,
    PRODUCTION,
    DiffParseError,
    classify,
    rules_from_manifest,
)
from tests.conftest import EXAMPLE

AUTHOR = {"author_name": "Agent", "author_email": "agent@example.test"}

KERNEL = """\
import triton.language as tl


def merge_state(M_chunk, M, S, H):
    # merge per-shard state of the context-parallel path
    M = tl.dot(M_chunk, M)
    S_next = tl.dot(M, S) + H
    return M, S_next
"""


def unified(path: str, old: str, new: str) -> str:
    """A unified diff of one file, with git's a/ b/ prefixes."""
    lines = difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                 fromfile=f"a/{path}", tofile=f"b/{path}")
    return "".join(lines)


def git_diff(tmp_path: Path, files: dict[str, str], edits: dict[str, str]) -> str:
    """The diff git itself writes for `edits` applied on top of `files`."""
    src = tmp_path / "src"
    for name, text in files.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text(text)
    repo = tmp_path / "repo.git"
    base = gitops.repo_init_from_dir(src, repo, branch="main", message="base")
    tree = tmp_path / "wt"
    gitops.worktree_add(repo, tree, base)
    for name, text in edits.items():
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_text(text)
    head = gitops.commit_all(tree, "edit", **AUTHOR)
    assert head is not None
    return gitops.diff(repo, base, head)


def test_a_tf32x3_precision_change_is_numerics_on_its_own_line(tmp_path: Path) -> None:
    new = KERNEL.replace('S_next = tl.dot(M, S) + H',
                         'S_next = tl.dot(M, S, input_precision="tf32x3") + H')
    diff = git_diff(tmp_path, {"kda/cp_merge.py": KERNEL}, {"kda/cp_merge.py": new})

    findings = classify(diff)

    precision = [f for f in findings if f.rule == "precision"]
    assert [(f.category, f.path, f.line) for f in precision] == [
        (NUMERICS, "kda/cp_merge.py", 7)
    ]
    assert 'input_precision="tf32x3"' in precision[0].text
    assert precision[0].reason == "changes a precision mode or numeric type"


def test_a_removed_line_is_numbered_in_the_old_file() -> None:
    old = "a = 1\nb = 2\nx = x.to(dtype=torch.float16)\nc = 3\n"
    new = "a = 1\nb = 2\nc = 3\n"

    findings = classify(unified("model.py", old, new))

    assert [(f.rule, f.line, f.text) for f in findings] == [
        ("precision", 3, "x = x.to(dtype=torch.float16)")
    ]


@pytest.mark.parametrize(("path", "old", "new", "rule"), [
    ("csrc/deep_ep/intranode.cpp",
     "void dispatch() {\n  launch();\n  wait_gpu();\n}\n",
     "void dispatch() {\n  launch();\n  Py_BEGIN_ALLOW_THREADS\n  wait_gpu();\n"
     "  Py_END_ALLOW_THREADS\n}\n",
     "locks"),
    ("serving/transfer.py",
     "class Transfer:\n    def __init__(self):\n        self.queue = []\n",
     "import threading\n\n\nclass Transfer:\n    def __init__(self):\n        self.queue = []\n"
     "        self.guard = threading.Lock()\n",
     "locks"),
])
def test_a_gil_or_lock_change_is_concurrency(path: str, old: str, new: str, rule: str) -> None:
    findings = classify(unified(path, old, new))

    assert findings, "a concurrency change went unflagged"
    assert {f.category for f in findings} == {CONCURRENCY}
    assert {f.rule for f in findings} == {rule}
    assert all(f.path == path for f in findings)
    # Each flagged line is an added one: its text appears in the new file.
    assert all(f.text in new for f in findings)


def test_two_flagged_lines_of_the_gil_change_have_their_own_numbers() -> None:
    old = "void dispatch() {\n  launch();\n  wait_gpu();\n}\n"
    new = ("void dispatch() {\n  launch();\n  Py_BEGIN_ALLOW_THREADS\n  wait_gpu();\n"
           "  Py_END_ALLOW_THREADS\n}\n")

    findings = classify(unified("csrc/intranode.cpp", old, new))

    assert [(f.line, f.text.strip()) for f in findings] == [
        (3, "Py_BEGIN_ALLOW_THREADS"), (5, "Py_END_ALLOW_THREADS"),
    ]


@pytest.mark.parametrize("path", [
    "deploy/serving.yaml", "deploy/prod/values.yaml", "k8s/engine.yaml", "docker/Dockerfile",
])
def test_any_change_to_a_deployment_file_is_production(path: str) -> None:
    findings = classify(unified(path, "replicas: 2\n", "replicas: 3\n"))

    assert {(f.category, f.rule) for f in findings} == {(PRODUCTION, "deploy")}
    assert [f.line for f in findings] == [1, 1]  # the removed and the added line


def test_an_innocuous_change_outside_risky_paths_has_no_findings() -> None:
    assert classify(unified("README.md", "Hello\n", "Hello, world\n")) == []


def test_a_manifest_risk_rule_flags_a_config_change(tmp_path: Path) -> None:
    manifest = parse_manifest((EXAMPLE / "infraops.toml").read_text())
    rules = BUILTIN_RULES + rules_from_manifest(manifest.risk)
    config = (EXAMPLE / "config" / "serving.toml").read_text()
    diff = git_diff(tmp_path, {"config/serving.toml": config},
                    {"config/serving.toml": config.replace("batch_size = 2", "batch_size = 8")})

    findings = classify(diff, rules)

    assert {(f.category, f.rule, f.reason) for f in findings} == {
        (PRODUCTION, "serving-config", "changes the production serving configuration")
    }
    assert sorted((f.line, f.text) for f in findings) == [
        (2, "batch_size = 2"), (2, "batch_size = 8")
    ]
    # Without the manifest's rule, the same diff is not risky at all.
    assert classify(diff) == []


def test_a_manifest_rule_with_patterns_flags_only_matching_lines() -> None:
    rule = RiskRule("kv-layout", "numerics", "changes the KV-cache layout",
                    patterns=(r"\bkv_layout\b",))
    old = "block = 16\nkv_layout = 'nhd'\n"
    new = "block = 32\nkv_layout = 'hnd'\n"

    findings = classify(unified("engine/cache.py", old, new), rules_from_manifest([rule]))

    assert [(f.rule, f.line, f.text) for f in findings] == [
        ("kv-layout", 2, "kv_layout = 'nhd'"), ("kv-layout", 2, "kv_layout = 'hnd'"),
    ]


def test_context_lines_are_never_flagged() -> None:
    old = ("import threading\n\nlock = threading.Lock()\nx = torch.float16\n"
           "size = 1\n\nwith lock:\n    total = 0\n")
    new = old.replace("size = 1", "size = 2")
    diff = unified("serving/pool.py", old, new)
    assert "threading.Lock()" in diff  # it is in the hunk, as context

    findings = classify(diff)

    assert findings == []


def test_one_line_matching_two_patterns_of_one_rule_gives_one_finding() -> None:
    findings = classify(unified("k.py", "y = f(x)\n", "y = f(x, dtype=fp16, atol=1e-3)\n"))

    assert [(f.rule, f.line) for f in findings] == [("precision", 1)]


def test_findings_serialise_to_plain_dicts() -> None:
    [finding] = classify(unified("k.py", "y = 1\n", "y = bfloat16(1)\n"))

    assert finding.as_dict() == {
        "category": NUMERICS, "rule": "precision",
        "reason": "changes a precision mode or numeric type", "path": "k.py", "line": 1,
        "text": "y = bfloat16(1)",
    }


def test_a_malformed_diff_raises_diff_parse_error() -> None:
    broken = "--- a/k.py\n+++ b/k.py\n@@ -1,3 +1,3 @@\n-x = 1\n+x = 2\n"

    with pytest.raises(DiffParseError, match="not a unified diff"):
        classify(broken)


def test_prose_that_is_not_a_diff_raises_diff_parse_error() -> None:
    with pytest.raises(DiffParseError):
        classify("Please merge: I changed the tf32 precision of the dot.\n")
