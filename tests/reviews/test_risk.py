"""reviews.risk.classify on real unified diffs: which changed lines are risky, and why."""

from __future__ import annotations

import difflib
import json
from pathlib import Path

import pytest

from infraops import gitops
from infraops.manifest import RiskRule, parse_manifest
from reviews.risk import (
    BUILTIN_RULES,
    CONCURRENCY,
    NUMERICS,
    PRODUCTION,
    UNCLASSIFIED,
    DiffParseError,
    Finding,
    classify,
    risk_classes,
    rules_from_manifest,
)
from reviews.risk.analysers import log_arguments
from reviews.risk.changes import hoisted_default, normal_tokens
from reviews.risk.code import only_stream_changed
from reviews.risk.diff import ADDED, REMOVED, DiffLine
from reviews.risk.environment import draws_or_rounds, switches_collective
from reviews.risk.families import _same_argument
from reviews.risk.lexers import Token, lex_c, lex_python
from reviews.risk.signatures import is_log_line
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
    assert precision[0].reason == (
        'sets the input precision of a dot product (input_precision="tf32x3"): tf32 keeps 10 '
        "mantissa bits, tf32x3 and ieee are closer to FP32")
    assert precision[0].context == "merge_state"


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
    # Without the manifest's rule the built-in serving analysis flags the same lines: a batch
    # limit in a serving configuration is production whoever names it.
    assert {(f.category, f.rule, f.line, f.text) for f in classify(diff)} == {
        (PRODUCTION, "serving", 2, "batch_size = 2"), (PRODUCTION, "serving", 2, "batch_size = 8")
    }


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

    # the changed number itself fails closed (a serving file, no rule knows it): issue 27
    assert [(f.rule, f.side, f.text) for f in findings] == [
        ("unsure", "removed", "size = 1"), ("unsure", "added", "size = 2")]


def test_one_line_matching_two_patterns_of_one_rule_gives_one_finding() -> None:
    findings = classify(unified("k.py", "y = f(x)\n", "y = f(x, dtype=fp16, atol=1e-3)\n"))

    assert [(f.rule, f.line) for f in findings] == [("precision", 1)]


def test_findings_serialise_to_plain_dicts() -> None:
    [finding] = classify(unified("k.py", "y = 1\n", "y = bfloat16(1)\n"))

    assert finding.as_dict() == {
        "category": NUMERICS, "rule": "precision",
        "reason": "changes a numeric type (bfloat16(1)): a different precision or range",
        "path": "k.py", "line": 1, "text": "y = bfloat16(1)", "side": "added", "context": "",
    }
    assert json.loads(json.dumps(finding.as_dict())) == finding.as_dict()


def test_a_malformed_diff_raises_diff_parse_error() -> None:
    broken = "--- a/k.py\n+++ b/k.py\n@@ -1,3 +1,3 @@\n-x = 1\n+x = 2\n"

    with pytest.raises(DiffParseError, match="not a unified diff"):
        classify(broken)


def test_prose_that_is_not_a_diff_raises_diff_parse_error() -> None:
    with pytest.raises(DiffParseError):
        classify("Please merge: I changed the tf32 precision of the dot.\n")


# --- Whole files: binaries, unknown languages, renames, modes, deletions ---------------------

BINARY = """\
diff --git a/engine/_C.so b/engine/_C.so
index 1a2b3c4..5d6e7f8 100755
Binary files a/engine/_C.so and b/engine/_C.so differ
"""
GIT_BINARY_PATCH = """\
diff --git a/kernels/attn.cubin b/kernels/attn.cubin
new file mode 100644
index 0000000000000000000000000000000000000000..6e74803e9686e0075df239f3d091bc9b08ea5274
GIT binary patch
literal 12
TcmZ?wbhEHbWMp7qU|?VX00RI3

literal 0
HcmV?d00001

"""
ZIG = """\
diff --git a/tools/tok.zig b/tools/tok.zig
index 1111111..2222222 100644
--- a/tools/tok.zig
+++ b/tools/tok.zig
@@ -1,3 +1,3 @@
 pub fn count(text: []const u8) usize {
-    var n: usize = 0;
+    var n: usize = 1;
     return n;
"""
RENAMED_DOC = """\
diff --git a/docs/precision.md b/docs/guides/precision.md
similarity index 100%
rename from docs/precision.md
rename to docs/guides/precision.md
"""
DEPLOY_MODE = """\
diff --git a/deploy/restart.sh b/deploy/restart.sh
old mode 100644
new mode 100755
"""
TOOL_MODE = """\
diff --git a/scripts/format.py b/scripts/format.py
old mode 100644
new mode 100755
"""
DELETED_LOCK = """\
diff --git a/engine/pool.py b/engine/pool.py
deleted file mode 100644
index 3b18e51..0000000
--- a/engine/pool.py
+++ /dev/null
@@ -1,3 +0,0 @@
-import threading
-
-POOL_LOCK = threading.Lock()
"""
EMPTY_NEW = """\
diff --git a/engine/__init__.py b/engine/__init__.py
new file mode 100644
index 0000000..e69de29
"""
BINARY_IN_DEPLOY = """\
diff --git a/deploy/certs/ca.der b/deploy/certs/ca.der
index 1a2b3c4..5d6e7f8 100644
Binary files a/deploy/certs/ca.der and b/deploy/certs/ca.der differ
"""


@pytest.mark.parametrize(("diff", "expected"), [
    pytest.param(BINARY, [(UNCLASSIFIED, "unreadable", "engine/_C.so", None)], id="binary"),
    pytest.param(GIT_BINARY_PATCH, [(UNCLASSIFIED, "unreadable", "kernels/attn.cubin", None)],
                 id="git-binary-patch"),
    pytest.param(ZIG, [(UNCLASSIFIED, "unreadable", "tools/tok.zig", None)],
                 id="unknown-language"),
    pytest.param(RENAMED_DOC, [], id="renamed-doc"),
    pytest.param(DEPLOY_MODE, [(PRODUCTION, "deploy", "deploy/restart.sh", None)],
                 id="mode-change-in-deploy"),
    pytest.param(TOOL_MODE, [], id="mode-change-of-a-dev-script"),
    pytest.param(DELETED_LOCK, [(CONCURRENCY, "locks", "engine/pool.py", 3)],
                 id="deleted-file-with-a-lock"),
    pytest.param(EMPTY_NEW, [], id="empty-new-file"),
    pytest.param(BINARY_IN_DEPLOY, [(UNCLASSIFIED, "unreadable", "deploy/certs/ca.der", None),
                                    (PRODUCTION, "deploy", "deploy/certs/ca.der", None)],
                 id="binary-in-deploy"),
])
def test_whole_file_changes_are_classified_by_what_can_be_read(
        diff: str, expected: list[tuple[str, str, str, int | None]]) -> None:
    findings = classify(diff)

    assert [(f.category, f.rule, f.path, f.line) for f in findings] == expected


def test_an_unclassified_file_says_why() -> None:
    [binary] = classify(BINARY)
    [unknown] = classify(ZIG)

    assert binary.reason == "binary file: the classifier cannot read it"
    assert unknown.reason == "unknown language (.zig)"
    assert (binary.side, binary.text) == ("file", "")


# --- What is harmless ------------------------------------------------------------------------

SAMPLER = """\
import torch


def sample(logits, temperature):
    # The lock-free path: logits stay in float32 here.
    logits = logits.float() / temperature
    scores = torch.softmax(logits, dim=-1)
    return torch.multinomial(scores, 1)
"""
KERNEL_CU = """\
static __global__ void scale_rows(const float * x, float * dst, const int ncols) {
    const int row = blockIdx.x;
    for (int col = threadIdx.x; col < ncols; col += blockDim.x) {
        dst[row*ncols + col] = 2.0f * x[row*ncols + col];
    }
}
"""


@pytest.mark.parametrize(("path", "old", "new"), [
    pytest.param("engine/sampler.py", SAMPLER, SAMPLER.replace(
        "# The lock-free path: logits stay in float32 here.",
        "# No lock is taken here; logits stay in float32 (float16 underflows)."),
        id="comment-mentioning-lock-and-float16"),
    pytest.param("engine/sampler.py", SAMPLER, SAMPLER.replace(
        "def sample(logits, temperature):\n",
        'def sample(logits, temperature):\n    """Sample in float16 under the lock."""\n'),
        id="docstring"),
    pytest.param("engine/sampler.py", SAMPLER, SAMPLER.replace("scores", "probs"),
                 id="local-rename"),
    pytest.param("engine/sampler.py", SAMPLER, SAMPLER.replace(
        "def sample(logits, temperature):",
        "def sample(logits: torch.Tensor, temperature: float) -> torch.Tensor:"),
        id="type-hints"),
    pytest.param("engine/sampler.py", SAMPLER, "import threading\n" + SAMPLER,
                 id="an-import-alone"),
    pytest.param("engine/loader.py", 'log.info("loading weights")\n',
                 'log.info("loading weights (float16 or bfloat16)")\n', id="log-message"),
    pytest.param("tests/test_sampler.py", "assert_close(a, b, atol=1e-2)\n",
                 "assert_close(a, b, atol=1e-3)\n", id="test-tolerance-tightened"),
    pytest.param("README.md", "Run with `--tensor-parallel-size 2`.\n",
                 "Run with `--tensor-parallel-size 4`.\n", id="readme"),
    pytest.param("csrc/ring.hpp", "// producer owns head_\n",
                 "// producer owns head_ (an atomic, no mutex)\n", id="c-comment"),
    pytest.param("csrc/scale.cu", KERNEL_CU, KERNEL_CU.replace(
        "    for (int col", "#pragma unroll\n    for (int col"), id="pragma-unroll"),
    pytest.param(".gitignore", "build/\n", "build/\n*.so\n", id="gitignore"),
])
def test_a_harmless_change_has_no_findings(path: str, old: str, new: str) -> None:
    assert classify(unified(path, old, new)) == []


# --- What is risky, and why ------------------------------------------------------------------

QUEUE = """\
import threading


class Jobs:
    def __init__(self):
        self._lock = threading.Lock()
        self.items = []

    def add(self, item):
        with self._lock:
            self.items.append(item)
"""
TRITON = """\
import triton
import triton.language as tl


@triton.jit
def scale_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(out_ptr + offs, x * 2, mask=offs < n)
"""
SOFTMAX = """\
import torch


def stable_softmax(x):
    m = x.amax(dim=-1, keepdim=True)
    e = (x - m).exp()
    return e / e.sum(dim=-1, keepdim=True)
"""


@pytest.mark.parametrize(("path", "old", "new", "expected"), [
    pytest.param("engine/jobs.py", QUEUE, QUEUE.replace(
        "        with self._lock:\n            self.items.append(item)\n",
        "        self.items.append(item)\n"),
        {(CONCURRENCY, "locks", 10, "removed")}, id="removed-lock"),
    pytest.param("engine/native.py", "lib = ctypes.CDLL(path)\n", "lib = ctypes.PyDLL(path)\n",
                 {(CONCURRENCY, "locks", 1, "removed"), (CONCURRENCY, "locks", 1, "added")},
                 id="cdll-to-pydll"),
    pytest.param("engine/ep.py", "RELEASE_GIL = False\n", "RELEASE_GIL = True\n",
                 {(CONCURRENCY, "locks", 1, "removed"), (CONCURRENCY, "locks", 1, "added")},
                 id="a-value-of-a-gil-setting"),
    pytest.param("kda/merge.py", 'INPUT_PRECISION = "tf32"\n', 'INPUT_PRECISION = "tf32x3"\n',
                 {(NUMERICS, "precision", 1, "removed"), (NUMERICS, "precision", 1, "added")},
                 id="a-value-of-a-precision-setting"),
    pytest.param("kernels/scale.py", TRITON, TRITON.replace("x * 2", "x * 2 + 1"),
                 {(NUMERICS, "kernel", 9, "added")}, id="inside-a-triton-kernel"),
    pytest.param("engine/softmax.py", SOFTMAX, SOFTMAX.replace("(x - m).exp()", "x.exp()"),
                 {(NUMERICS, "accumulation", 6, "removed")}, id="inside-a-softmax"),
    pytest.param("csrc/scale.cu", KERNEL_CU, KERNEL_CU.replace(
        "        dst[row*ncols + col] = 2.0f * x[row*ncols + col];\n",
        "        dst[row*ncols + col] = 2.0f * x[row*ncols + col];\n        __syncthreads();\n"),
        {(CONCURRENCY, "sync", 5, "added")}, id="syncthreads"),
    pytest.param("csrc/scale.cu", KERNEL_CU, KERNEL_CU.replace("2.0f * x", "__expf(x")
                 .replace("col];\n    }", "col]);\n    }"),
                 {(NUMERICS, "kernel", 4, "removed"), (NUMERICS, "fast-math", 4, "added")},
                 id="approximate-intrinsic"),
    pytest.param("CMakeLists.txt", 'set(CMAKE_CUDA_FLAGS "-O3")\n',
                 'set(CMAKE_CUDA_FLAGS "-O3 --use_fast_math")\n',
                 {(NUMERICS, "fast-math", 1, "added")}, id="fast-math-flag"),
    pytest.param("scripts/bench.sh", "vllm serve $MODEL \\\n    --tensor-parallel-size 4\n",
                 "vllm serve $MODEL \\\n    --tensor-parallel-size 8\n",
                 {(PRODUCTION, "launch", 2, "removed"), (PRODUCTION, "launch", 2, "added")},
                 id="launch-flag"),
    pytest.param("configs/engine.yaml", "model: llama\nmax_num_seqs: 256\n",
                 "model: llama\nmax_num_seqs: 512\n",
                 {(PRODUCTION, "serving", 2, "removed"), (PRODUCTION, "serving", 2, "added")},
                 id="serving-yaml-key"),
    pytest.param("engine.yaml", "apiVersion: apps/v1\nkind: Deployment\nspec:\n  replicas: 2\n",
                 "apiVersion: apps/v1\nkind: Deployment\nspec:\n  replicas: 3\n",
                 {(PRODUCTION, "deploy", 4, "removed"), (PRODUCTION, "deploy", 4, "added")},
                 id="kubernetes-manifest-outside-k8s"),
])
def test_a_risky_change_gets_its_class_on_its_lines(
        path: str, old: str, new: str, expected: set[tuple[str, str, int, str]]) -> None:
    findings = classify(unified(path, old, new))

    assert {(f.category, f.rule, f.line, f.side) for f in findings} == expected
    assert all(f.path == path and f.reason for f in findings)


def test_the_context_names_the_enclosing_kernel() -> None:
    # Only the added line has a changed token: "+ 1" was inserted, nothing was removed.
    [added] = classify(unified("kernels/scale.py", TRITON, TRITON.replace("x * 2", "x * 2 + 1")))

    assert (added.side, added.context) == ("added", "scale_kernel")
    assert added.reason == ("changes code inside the Triton kernel `scale_kernel`: its "
                            "arithmetic, indexing or order of operations")


def test_a_store_replaced_by_an_atomic_is_concurrency_only() -> None:
    old = "__global__ void count(int * c, const int * e) {\n    c[e[threadIdx.x]] += 1;\n}\n"
    new = old.replace("c[e[threadIdx.x]] += 1;", "atomicAdd(&c[e[threadIdx.x]], 1);")

    assert risk_classes(classify(unified("csrc/count.cu", old, new))) == [CONCURRENCY]


# --- Rules: built-in subsets, targets, precedence ----------------------------------------------

def test_a_subset_of_the_builtin_rules_keeps_only_their_findings() -> None:
    diff = unified("engine/mix.py", "x = 1\n", "x = y.half()\nlock = threading.Lock()\n")
    numerics_only = [rule for rule in BUILTIN_RULES if rule.category == NUMERICS]

    assert risk_classes(classify(diff)) == [CONCURRENCY, NUMERICS]
    assert risk_classes(classify(diff, numerics_only)) == [NUMERICS]


def test_a_target_rule_outranks_a_builtin_finding_of_its_category_only() -> None:
    rule = RiskRule("engine-knobs", "production", "changes the engine's tuned knobs",
                    patterns=(r"max_num_seqs",))
    diff = unified("engine/args.py", "max_num_seqs: int = 256\n",
                   "max_num_seqs: int = 512\nlock = threading.Lock()\n")

    findings = classify(diff, BUILTIN_RULES + rules_from_manifest([rule]))

    assert {(f.rule, f.line, f.side) for f in findings} == {
        ("engine-knobs", 1, "removed"), ("engine-knobs", 1, "added"), ("locks", 2, "added"),
    }


def test_a_target_path_rule_flags_a_file_without_lines_as_a_whole() -> None:
    rule = RiskRule("prebuilt", "numerics", "prebuilt kernels change results",
                    paths=("kernels/**",))

    findings = classify(GIT_BINARY_PATCH, BUILTIN_RULES + rules_from_manifest([rule]))

    assert [(f.category, f.rule, f.line) for f in findings] == [
        (UNCLASSIFIED, "unreadable", None), (NUMERICS, "prebuilt", None),
    ]


def test_findings_come_in_diff_order() -> None:
    diff = (unified("b.py", "x = 1\n", "x = y.half()\n")
            + unified("a.py", "lock = None\n", "lock = threading.Lock()\n"))

    assert [(f.path, f.side) for f in classify(diff)] == [
        ("b.py", "added"), ("a.py", "removed"), ("a.py", "added"),
    ]


def test_risk_classes_are_the_sorted_distinct_categories() -> None:
    def finding(category: str) -> Finding:
        return Finding(category, "r", "why", "p", 1, "t")

    assert risk_classes([finding(PRODUCTION), finding(NUMERICS), finding(PRODUCTION)]) == [
        NUMERICS, PRODUCTION,
    ]
    assert risk_classes([]) == []


def test_a_diff_parse_error_is_a_value_error() -> None:
    assert issubclass(DiffParseError, ValueError)
    assert classify("") == []


# --- Renames, moves, contexts the hunk does not show -------------------------------------------

def test_a_rename_needs_the_new_name_bound_in_the_diff() -> None:
    rename = TRITON.replace("x = tl.load", "v = tl.load").replace("x * 2", "v * 2")
    # `n` is a parameter the diff does not bind anew: using it is a change, not a rename.
    substitution = TRITON.replace("offs, x * 2", "offs, n * 2")

    assert classify(unified("kernels/scale.py", TRITON, rename)) == []
    assert risk_classes(classify(unified("kernels/scale.py", TRITON, substitution))) == [NUMERICS]


def test_code_moved_to_another_file_is_not_flagged_but_one_common_line_is() -> None:
    helper = "def guard(fn):\n    with _lock:\n        value = fn()\n    return value\n"
    moved = (unified("engine/utils.py", "import os\n\n" + helper, "import os\n")
             + unified("engine/guards.py", "", helper))
    one_line = (unified("engine/a.py", "x = 1\nwith _lock:\n    x = 2\n", "x = 1\n    x = 2\n")
                + unified("engine/b.py", "y = 1\n", "y = 1\nwith _lock:\n"))

    assert classify(moved) == []
    assert {(f.path, f.side) for f in classify(one_line)} >= {("engine/a.py", "removed")}


def test_a_cuda_function_whose_qualifiers_are_above_the_hunk_is_device_code(
        tmp_path: Path) -> None:
    old = ("template <int kThreads>\n__global__ void __launch_bounds__(kThreads, 1)\n"
           "combine(int * out, const int * x, int n) {\n    const int lane = threadIdx.x;\n"
           "    for (int i = lane; i < n; i += 32) {\n        out[i] = x[i];\n    }\n"
           "    out[0] += 0;\n    out[1] += 0;\n    out[2] += 0;\n    out[3] += 0;\n"
           "    out[4] += 0;\n    out[5] += 0;\n    out[6] += 0;\n    out[7] = x[7];\n}\n")
    new = old.replace("    out[7] = x[7];", "    out[7] = x[7] + 1;")
    diff = git_diff(tmp_path, {"csrc/combine.cu": old}, {"csrc/combine.cu": new})
    # The hunk shows neither the qualifiers nor threadIdx; git names the function.
    assert "@@ -12,5 +12,5 @@ combine(int * out" in diff

    [finding] = classify(diff)

    assert (finding.category, finding.rule, finding.context) == (NUMERICS, "kernel", "combine")


def test_threads_in_a_kernel_language_are_gpu_lanes_not_host_threads() -> None:
    tilelang = ("import tilelang.language as T\n\n\ndef build(threads: int = 128):\n"
                "    return T.Kernel(4, threads=threads)\n")

    findings = classify(unified("kernels/tl_h.py", tilelang, tilelang.replace("128", "256")))

    assert risk_classes(findings) == [NUMERICS]


# Issue 27: the kinds that went through held-out diffs with no finding, one case per family.
@pytest.mark.parametrize(("path", "old", "new", "classes"), [
    pytest.param("engine/ops/matmul.py", "BLOCK_K = 64\n", "BLOCK_K = 128\n", [NUMERICS],
                 id="block-size-at-module-level"),
    pytest.param("engine/ops/reduce.py", "def launch(x):\n    n_split = 1\n    run(x, n_split)\n",
                 "def launch(x):\n    n_split = 4\n    run(x, n_split)\n", [NUMERICS],
                 id="split-k-in-a-launcher"),
    pytest.param("engine/ops/tiles.py", "TILE_SIZES = [\n    (64, 64),\n]\n",
                 "TILE_SIZES = [\n    (64, 64),\n    (128, 32),\n]\n", [NUMERICS],
                 id="a-row-of-a-tile-table"),
    pytest.param("tests/ops/test_norm.py", "assert_close(out, ref, rtol=1e-4)\n",
                 "assert_close(out, ref, rtol=1e-2)\n", [NUMERICS], id="loosened-test-tolerance"),
    pytest.param("tests/ops/test_norm.py", "    torch.manual_seed(0)\n",
                 "    torch.manual_seed(3)\n", [NUMERICS], id="seed-in-a-test"),
    pytest.param("engine/sample.py", "rng = np.random.default_rng(seed=1)\n",
                 "rng = np.random.default_rng(seed=2)\n", [NUMERICS], id="seed-in-code"),
    pytest.param("csrc/reduce.cu", "  out[i] = acc;\n", "  atomicAdd(&out[i], acc);\n",
                 [CONCURRENCY, NUMERICS], id="float-atomic"),
    pytest.param("csrc/reduce.cu", "  v += __shfl_xor_sync(0xffffffff, v, 16);\n",
                 "  v += __shfl_xor_sync(0x0000ffff, v, 16);\n", [CONCURRENCY, NUMERICS],
                 id="warp-shuffle-mask"),
    pytest.param("csrc/copy.cu", "  load(a);\n  __syncthreads();\n  use(a);\n",
                 "  load(a);\n  use(a);\n  __syncthreads();\n", [CONCURRENCY],
                 id="moved-barrier"),
    pytest.param("engine/dist.py", "def init():\n    pass\n",
                 "def init():\n    os.environ['NCCL_P2P_DISABLE'] = '1'\n", [PRODUCTION],
                 id="nccl-env-from-python"),
    pytest.param("app/main.py", "@app.deployment(num_replicas=2)\nclass Model:\n",
                 "@app.deployment(num_replicas=4)\nclass Model:\n", [PRODUCTION],
                 id="replicas-in-a-decorator"),
    pytest.param("configs/model.json", '{\n  "torch_dtype": "float16"\n}\n',
                 '{\n  "torch_dtype": "bfloat16"\n}\n', [NUMERICS, PRODUCTION],
                 id="dtype-in-a-config-file"),
    # Second round: the moved validation set and the new corpus diffs.
    pytest.param("fla/ops/kda/intra.py", "    BT = chunk_size\n    grid = (NT, B * H)\n",
                 "    BT = chunk_size\n    BK = triton.next_power_of_2(K)\n"
                 "    grid = (NT, B * H)\n",
                 [NUMERICS], id="computed-tile-size-in-a-launcher"),
    pytest.param("fused_moe/core.py", "    num_splits_k = 1\n",
                 "    num_splits_k = 2 if hidden_size >= 4096 else 1\n", [NUMERICS],
                 id="splits-k-name"),
    pytest.param("fla/ops/kda/recurrent.py", "        b_g = tl.load(p_g).to(tl.float32)\n",
                 "        b_g = tl.load(p_g, mask=mask_k, other=0).to(tl.float32)\n", [NUMERICS],
                 id="tl-call-with-the-kernel-out-of-sight"),
    pytest.param("deep_ep/buffer.py", "        num_logfmt_bits = 8\n",
                 "        num_logfmt_bits = 10\n", [NUMERICS], id="bits-of-a-number-format"),
    pytest.param("flashinfer_like/decode.py", "    k_scale = 1.0 if k_scale is None else k_scale\n",
                 "    k_scale = 1.0 / 448.0 if k_scale is None else k_scale\n", [NUMERICS],
                 id="a-quantisation-scale-default"),
    pytest.param("csrc/kernels/configs.cuh", "#define NUM_TIMEOUT_CYCLES 200000000000ull\n",
                 "#define NUM_TIMEOUT_CYCLES 20000000000ull\n", [CONCURRENCY],
                 id="a-timeout-constant"),
    pytest.param("csrc/topk.cu", "  status = TopKMultiCTA(x, k, stream);\n",
                 "  if (num_sms <= 16) {\n    status = cudaErrorNotSupported;\n  } else {\n"
                 "    status = TopKMultiCTA(x, k, stream);\n  }\n", [CONCURRENCY],
                 id="blocks-resident-for-a-grid-barrier"),
    pytest.param("fla/ops/attn/parallel.py",
                 "    tl.store(p_lse, b_m, boundary_check=(0,))\n",
                 "    if i_v == 0:\n        tl.store(p_lse, b_m, boundary_check=(0,))\n",
                 [CONCURRENCY], id="a-store-guarded-by-a-program-index"),
    pytest.param("csrc/kernels/utils.cuh",
                 "__device__ float warp_max(float v) {\n"
                 "    for (int offset = 16; offset > 0; offset >>= 1)\n"
                 "        v = max(v, __shfl_xor_sync(0xffffffff, v, offset));\n",
                 "__device__ float warp_max(float v) {\n"
                 "    for (int offset = 8; offset > 0; offset >>= 1)\n"
                 "        v = max(v, __shfl_xor_sync(0x0000ffff, v, offset));\n",
                 [CONCURRENCY], id="a-max-shuffle-narrowed-is-exact"),
    pytest.param("csrc/kernels/internode.cu",
                 "        if (lane_id == 0) {\n            tma_store_wait<0>();\n"
                 "            tma_store_1d(buf, row, bytes);\n        }\n",
                 "        tma_store_wait<0>();\n        if (lane_id == 0) {\n"
                 "            tma_store_1d(buf, row, bytes);\n        }\n",
                 [CONCURRENCY], id="a-tma-wait-hoisted"),
    pytest.param("setup.py", "    nvshmem_lib = 'nvshmem_host'\n",
                 "    nvshmem_lib = find_soname('libnvshmem_host.so')\n", [PRODUCTION],
                 id="a-library-a-build-recipe-links"),
    pytest.param("training/parser.py", "    return args\n",
                 "    transformers.set_seed(args.seed)\n    return args\n", [NUMERICS],
                 id="a-seed-call-added"),
    pytest.param("tests/ops/test_delta.py", "    torch.manual_seed(42)\n    q = make()\n",
                 "    q = make()\n", [NUMERICS], id="a-test-seed-removed"),
    pytest.param("app/serve.py",
                 "@serve.deployment(\n    autoscaling_config={\"min_replicas\": 1, "
                 "\"max_replicas\": 4},\n)\nclass Embedder:\n",
                 "@serve.deployment(\n    autoscaling_config={\"min_replicas\": 1, "
                 "\"max_replicas\": 8},\n)\nclass Embedder:\n",
                 [PRODUCTION], id="replicas-inside-a-multi-line-decorator"),
])
def test_the_kinds_issue_27_found_missing_are_classified(path: str, old: str, new: str,
                                                        classes: list[str]) -> None:
    assert risk_classes(classify(unified(path, old, new))) == classes


def test_an_unknown_change_of_a_number_in_a_kernel_file_fails_closed() -> None:
    old = "def forward(self, x):\n    y = self.proj(x)\n    return y * 0.5\n"
    new = old.replace("0.5", "0.25")

    findings = classify(unified("model/layers/mlp.py", old, new))

    assert [(f.category, f.rule, f.side) for f in findings] == [
        (UNCLASSIFIED, "unsure", "removed"), (UNCLASSIFIED, "unsure", "added")]
    assert "a reviewer decides" in findings[0].reason


@pytest.mark.parametrize(("path", "old", "new"), [
    pytest.param("model/layers/mlp.py", "    y = self.proj(x)  # project\n",
                 "    y = self.proj(x)  # project to the hidden size\n", id="comment"),
    pytest.param("model/layers/mlp.py", "    h = self.proj(x)\n    return h * 2\n",
                 "    hidden = self.proj(x)\n    return hidden * 2\n", id="rename"),
    pytest.param("model/layers/mlp.py", '    log.info("proj %d", 3)\n',
                 '    log.info("projected %d", 3)\n', id="log-text"),
    pytest.param("tests/ops/test_mlp.py", "def test_mlp():\n    x = make(3)\n",
                 "def test_mlp_matches_reference():\n    x = make(3)\n", id="test-rename"),
    # Near-misses of the second round of families.
    pytest.param("deep_ep/buffer.py", "        num_log_lines = 8\n",
                 "        num_log_lines = 10\n", id="a-number-no-family-names"),
    pytest.param("fla/ops/attn/parallel.py",
                 "    tl.store(p_lse, b_m, boundary_check=(0,))\n",
                 "    # only the first value split stores the LSE\n"
                 "    tl.store(p_lse, b_m, boundary_check=(0,))\n", id="a-comment-over-a-store"),
    pytest.param("csrc/kernels/configs.cuh",
                 "#define NUM_TIMEOUT_CYCLES 200000000000ull  // about 100 s\n",
                 "#define NUM_TIMEOUT_CYCLES 200000000000ull  // about 100 s at 2 GHz\n",
                 id="a-comment-on-a-timeout"),
    pytest.param("setup.py", "    version='1.0.1',\n", "    version='1.0.2',\n",
                 id="a-version-in-a-build-recipe"),
    pytest.param("training/parser.py", "    # seeds are set by the trainer\n",
                 "    # seeds are set by the trainer, once per run\n", id="a-comment-on-seeds"),
    pytest.param("deep_ep/buffer.py",
                 "        Arguments:\n            x: `torch.Tensor` with `torch.bfloat16`.\n",
                 "        Arguments:\n            x: `torch.Tensor` with `torch.bfloat16`, "
                 "shaped as `[n, hidden]`;\n                only several hidden sizes work.\n",
                 id="a-docstring-quoting-a-dtype-in-backticks"),
])
def test_harmless_changes_in_a_kernel_file_do_not_fail_closed(path: str, old: str,
                                                              new: str) -> None:
    assert classify(unified(path, old, new)) == []


def test_a_loosened_tolerance_in_a_test_is_a_numerics_change() -> None:
    findings = classify(unified("tests/test_sampler.py", "assert_close(a, b, atol=1e-3)\n",
                                "assert_close(a, b, atol=1e-2)\n"))

    assert {(f.category, f.side) for f in findings} == {(NUMERICS, "removed"),
                                                        (NUMERICS, "added")}


def test_a_summing_shuffle_stays_numerics_too() -> None:
    old = "    for (int m = 4; m > 0; m /= 2)\n        s += __shfl_xor_sync(FULL, s, m, 8);\n"
    new = "    for (int m = 8; m > 0; m /= 2)\n        s += __shfl_xor_sync(FULL, s, m, 16);\n"

    assert risk_classes(classify(unified("csrc/routing.cu", old, new))) == [CONCURRENCY,
                                                                            NUMERICS]


# Issue 27, third round: files the classifier misread and the environment of runtimes.
@pytest.mark.parametrize(("path", "old", "new", "classes"), [
    pytest.param("Dockerfile_intel", "ENV LANG=C\nENV KMP_BLOCKTIME=1\n", "ENV LANG=C\n",
                 [CONCURRENCY, PRODUCTION], id="a-threading-runtime-variable"),
    pytest.param("deploy/run.sh", "export OMP_NUM_THREADS=8\n", "export OMP_NUM_THREADS=16\n",
                 [CONCURRENCY, PRODUCTION], id="threads-of-a-runtime-in-a-launcher"),
    pytest.param("Dockerfile_intel", "ENV CCL_ROOT=/opt/intel/ccl\n", "ENV CCL_ROOT=/opt/ccl\n",
                 [PRODUCTION], id="a-collective-library-path-is-production-only"),
    pytest.param("Dockerfile_amd", "ENV HIP_FORCE_DEV_KERNARG=1\n",
                 "ENV HIP_FORCE_DEV_KERNARG=0\n", [PRODUCTION], id="a-dockerfile-of-another-name"),
    pytest.param("launcher/src/main.rs", '    #[clap(default_value = "1.2", long, env)]\n',
                 '    #[clap(default_value = "0.3", long, env)]\n', [PRODUCTION],
                 id="a-launcher-default-in-rust"),
    pytest.param("build/Makefile-flashinfer", "\tpip install flashinfer\n",
                 '\tTORCH_CUDA_ARCH_LIST="8.0;9.0" pip install flashinfer\n', [PRODUCTION],
                 id="an-arch-list-in-a-make-recipe"),
])
def test_files_and_runtime_environments_are_read_for_what_they_run(
        path: str, old: str, new: str, classes: list[str]) -> None:
    assert risk_classes(classify(unified(path, old, new))) == classes


@pytest.mark.parametrize(("path", "old", "new"), [
    pytest.param("Dockerfile", "ENV PATH /opt/conda/bin:$PATH\n",
                 "ENV PATH=/opt/conda/bin:$PATH\n", id="an-env-line-respelled"),
    pytest.param("launcher/src/main.rs", "    /// 4 bit GTPQ quantization\n    quantize: bool,\n",
                 "    /// 4 bit AWQ quantization\n    quantize: bool,\n", id="a-rust-doc-comment"),
    pytest.param("router/src/infer.rs", '    info!("batch {} done", id);\n',
                 '    info!("batch {id} finished");\n', id="a-rust-log-line"),
])
def test_what_a_file_holds_unchanged_is_harmless(path: str, old: str, new: str) -> None:
    assert classify(unified(path, old, new)) == []


KL_DOC = """\
class KLDivFunction(torch.autograd.Function):
    \"\"\"
    The forward and backward pass of the KL divergence, as the formula says:
    it is computed in one kernel and reduced afterwards, as torch.nn.KLDivLoss does.
    Its reduction follows the reduction argument of the module.
    A second paragraph, so that the hunk starts inside the docstring.
    The formula, as code:
    ```python
    if log_target:
        loss = target * (target.log() - x)
    else:
        loss = target.exp() * (target - x)
    ```,
    then the loss is reduced according to the reduction argument,
    as the PyTorch documentation defines it for KLDivLoss.
    The closing quotes stay out of the hunk's sight.
    Like this line.
    \"\"\"
"""
TRITON_NORM = """\
@triton.jit
def _norm_fwd_kernel(X, Y, W, B, mean, rstd, BLOCK: tl.constexpr):
    x = tl.load(X + tl.arange(0, BLOCK))
    xc = x - mean
    y = xc * rstd * W + B

    # store the output once
    tl.store(Y + tl.arange(0, BLOCK), y.to(tl.float16))
"""


# Issue 27, third round: refactors of kernel code the second held-out set saw flagged.
@pytest.mark.parametrize(("path", "old", "new"), [
    pytest.param("ops/layer_norm.py", TRITON_NORM, TRITON_NORM.replace(
        "    xc = x - mean\n    y = xc * rstd * W + B\n", "    y = (x - mean) * rstd * W + B\n"),
        id="a-temporary-inlined-in-brackets"),
    pytest.param("ops/kl_div.py", KL_DOC, KL_DOC.replace(
        "        loss = target * (target.log() - x)\n    else:\n"
        "        loss = target.exp() * (target - x)\n",
        "        loss = target.exp() * (target - x)\n    else:\n"
        "        loss = target * (target.log() - x)\n"), id="code-in-a-docstring-fence"),
    pytest.param("fla/ops/kda/chunk.py",
                 "        >>> g = F.logsigmoid(torch.rand(B, T, H, dtype=torch.bfloat16))\n",
                 "        >>> g = F.logsigmoid(torch.rand(B, T, H, K, dtype=torch.bfloat16))\n",
                 id="a-doctest-line"),
    pytest.param("torchao/prototype/gptq/api.py",
                 "    for w, start in zip(ws, starts):\n        end = min(start + n, cols)\n"
                 "        err = torch.zeros_like(w)\n"
                 "        h_quantize_block = H[start:end, start:end]\n",
                 "    for w, k_start in zip(ws, starts):\n        k_end = min(k_start + n, cols)\n"
                 "        err = torch.zeros_like(w)\n"
                 "        h_quantize_block = H[k_start:k_end, k_start:k_end]\n",
                 id="a-rename-in-a-slice"),
    pytest.param("ops/layer_norm.py", TRITON_NORM, TRITON_NORM.replace(
        "    y = xc * rstd * W + B\n\n", "").replace(
        "y.to(tl.float16)", "(xc * rstd * W + B).to(tl.float16)"), id="a-temporary-inlined"),
    pytest.param("engine/layers/fp8.py", "        from .marlin import Fp8Linear\n\n"
                 "        return Fp8Linear\n",
                 "        from .marlin import Fp8Linear\n\n        if major == 8 and minor == 9:\n"
                 "            log_once(\n                logger.info,\n"
                 "                \"using the Marlin FP8 kernel\",\n            )\n"
                 "        return Fp8Linear\n", id="a-branch-that-only-logs"),
    pytest.param("csrc/kernels/traits.h", "enum Barriers : int {\n    kReady = 3\n};\n",
                 "enum Barriers : int {\n    kReady = 3,\n};\n", id="a-trailing-comma"),
    pytest.param("csrc/kernels/paged.cuh", "    if (q_idx != next_q_idx)\n        load_q(q_idx);\n",
                 "    if (q_idx != next_q_idx) {\n        load_q(q_idx);\n    }\n",
                 id="a-block-opened-around-a-statement"),
    pytest.param("setup.py", "        max_jobs = max(1, int(free_gb / 9))\n",
                 "        max_jobs = max(1, int(free_gb / (5 * nvcc_threads)))\n",
                 id="build-parallelism"),
    pytest.param("test/transformers/test_poly_norm.py", "            1.0,\n",
                 "            6e-1,\n", id="a-row-tolerance-tightened"),
    pytest.param("csrc/extension.cu", "  auto out = std::make_unique<Buffer>(n);\n",
                 "  auto out = std::make_unique<Buffer>(n);\n  // the caller owns it now\n"
                 "  Buffer* raw = out.release();\n", id="an-owner-released-not-a-barrier"),
])
def test_refactors_the_second_held_out_set_flagged_are_harmless(path: str, old: str,
                                                                new: str) -> None:
    assert classify(unified(path, old, new)) == []


@pytest.mark.parametrize(("old", "new"), [
    pytest.param("    t = b + c\n    y = a + t\n", "    y = a + b + c\n", id="a-sum-regrouped"),
    pytest.param("    t = b * c\n    b = b + 1\n    y = t + a\n",
                 "    b = b + 1\n    y = b * c + a\n", id="an-input-changed-before-the-use"),
])
def test_inlining_that_changes_the_computation_is_a_change(old: str, new: str) -> None:
    kernel = "@triton.jit\ndef k(a, b, c):\n{}    tl.store(p, y)\n"

    findings = classify(unified("ops/k.py", kernel.format(old), kernel.format(new)))

    assert risk_classes(findings) == [NUMERICS]


# Issue 27, third round: the families of the second held-out set's misses, one case each.
@pytest.mark.parametrize(("path", "old", "new", "classes"), [
    pytest.param("test/convergence/test_mini_models.py", "            32,\n            1e-5,\n",
                 "            32,\n            1e-3,\n", [NUMERICS], id="a-fraction-in-a-test-row"),
    pytest.param("hopper/test_attn.py", "    fwd_atol = 1e-4\n", "    fwd_atol = 1e-3\n",
                 [NUMERICS], id="a-tolerance-named-by-its-words"),
    pytest.param("hopper/test_attn.py", "    abs_tol = 1e-4\n    assert err <= abs_tol\n",
                 "    fwd_atol = 2 * ref_err\n    assert err <= fwd_atol\n", [NUMERICS],
                 id="a-tolerance-rewritten"),
    pytest.param("test/test_quant_api.py", "    torch.testing.assert_close(ref, out)\n",
                 "    torch.testing.assert_close(ref, out, atol=atol, rtol=rtol)\n", [NUMERICS],
                 id="a-comparison-given-a-tolerance"),
    pytest.param("tests/test_race.py", "    assert torch.equal(dq, dq0)\n",
                 "    assert torch.allclose(dq, dq0, atol=dq_atol)\n", [NUMERICS],
                 id="an-exact-comparison-made-approximate"),
    pytest.param("csrc/scheduler.cuh", "    auto offset = __ldg(layout + i);\n",
                 "    auto offset = max(0, __ldg(layout + i));\n", [NUMERICS],
                 id="a-clamp-in-a-cuda-header"),
    pytest.param("fla/layers/attn.py", "        offset = offset + mask.sum(-1) - n\n",
                 "        offset = (offset + mask.sum(-1) - n).clamp(min=0)\n", [NUMERICS],
                 id="a-clamp-in-a-forward-pass"),
    pytest.param("src/decode.cpp", "    decoder.rng = std::mt19937(0);\n",
                 "    decoder.rng = std::mt19937(j);\n", [NUMERICS], id="a-random-engine-seeded"),
    pytest.param("engine/sampling.py", "        generator = torch.Generator(device=device)\n",
                 "        generator = torch.cuda.default_generators[device.index]\n", [NUMERICS],
                 id="another-generator"),
    pytest.param("engine/layers/fp8.py",
                 "if self.load_scale or SYSTEM == 'rocm':\n    w = to_e4m3fnuz(w)\n",
                 "if self.load_scale and SYSTEM == 'rocm':\n    w = to_e4m3fnuz(w)\n",
                 [NUMERICS], id="the-condition-over-a-precision-step"),
    pytest.param("engine/ops/moe.py", "    use_triton_cast: bool = False,\n",
                 "    use_triton_cast: bool = True,\n", [NUMERICS], id="a-kernel-switched"),
    pytest.param("examples/server/server.cpp",
                 "struct params {\n    bool flash_attn = false;\n};\n",
                 "struct params {\n    bool flash_attn = true;\n};\n", [NUMERICS, PRODUCTION],
                 id="a-server-default-switching-a-kernel"),
    pytest.param("csrc/gemm.cuh", "    umma_barrier->wait(phase);\n    acc = load(tmem);\n",
                 "    umma_barrier->wait(phase);\n    tcgen05_after_thread_sync();\n"
                 "    acc = load(tmem);\n", [CONCURRENCY], id="a-fence-named-by-its-words"),
    pytest.param("csrc/gemm.cuh", "    free_tmem(cols);\n    store(out);\n",
                 "    store(out);\n    cluster_sync();\n    free_tmem(cols);\n", [CONCURRENCY],
                 id="moved-past-a-new-barrier"),
    pytest.param("csrc/mla.cu", "    int4 meta = __ldg(ptr);\n", "    int4 meta = *ptr;\n",
                 [CONCURRENCY], id="a-cache-hinted-load"),
    pytest.param("csrc/common/utils.hpp", "    reset();\n    cudaFree(ptr_);\n", "    reset();\n",
                 [CONCURRENCY], id="a-synchronising-free"),
    pytest.param("engine/dist.py", "    os.environ['CCL_WORKER_COUNT'] = '1'\n    init()\n",
                 "    init()\n", [CONCURRENCY, PRODUCTION], id="a-collective-worker-variable"),
    pytest.param("fla/utils.py", "USE_TMA = os.environ.get('FLA_USE_TMA', '0') != '1'\n",
                 "USE_TMA = os.environ.get('FLA_USE_TMA', '0') == '1'\n", [PRODUCTION],
                 id="an-environment-switch"),
    pytest.param("setup.py", '    nvcc_flags = [\n        "-O3",\n    ]\n',
                 '    nvcc_flags = [\n        "-O3",\n        "-Xfatbin",\n    ]\n', [PRODUCTION],
                 id="a-compiler-flag-in-a-build-recipe"),
    pytest.param("csrc/jit/compiler.hpp",
                 '    std::string arch = runtime->get_arch();\n'
                 '    flags = fmt::format("--gpu-architecture=sm_{}", arch);\n',
                 '    std::string arch = runtime->get_arch();\n'
                 '    if (arch == "100f" && minor < 9)\n        arch = "100a";\n'
                 '    flags = fmt::format("--gpu-architecture=sm_{}", arch);\n', [PRODUCTION],
                 id="an-architecture-a-jit-compiler-targets"),
    pytest.param("setup.py", "",
                 'DISABLE_FP16 = os.getenv("X_DISABLE_FP16", "0") == "1"\n'
                 "if not DISABLE_FP16:\n    sources.append('fwd_fp16.cu')\n", [PRODUCTION],
                 id="a-precision-a-build-recipe-names"),
    pytest.param("csrc/fmha_launcher.cu", "  params.mKernelType = Context;\n",
                 "  params.mKernelType = Context;\n  params.mMultiCtasKvMode = false;\n",
                 [UNCLASSIFIED], id="a-boolean-fails-closed"),
    pytest.param("engine/ops/fp8.py", "    if x.numel() > 0 and scale is None:\n        y = x\n",
                 "    if x.numel() > 0 or scale is None:\n        y = x\n", [UNCLASSIFIED],
                 id="logic-fails-closed"),
])
def test_the_kinds_the_second_held_out_set_missed_are_classified(
        path: str, old: str, new: str, classes: list[str]) -> None:
    assert risk_classes(classify(unified(path, old, new))) == classes


def test_a_new_name_is_judged_where_a_flagged_line_uses_it() -> None:
    traits = unified("csrc/kernels/traits.h", "enum Barriers : int {\n    kReady = 3\n};\n",
                     "enum Barriers : int {\n    kReady = 3,\n    kInitialized = 4,\n};\n")
    kernel = unified("csrc/kernels/mla.cu", "    wait_q();\n    gemm(q, k);\n",
                     "    wait_q();\n    NamedBarrier::arrive_and_wait(128, kInitialized);\n"
                     "    gemm(q, k);\n")

    assert risk_classes(classify(traits)) == [UNCLASSIFIED]
    assert risk_classes(classify(traits + kernel)) == [CONCURRENCY]


@pytest.mark.parametrize(("path", "old", "new", "classes"), [
    pytest.param("src/engine/decoding.cc", "    tp_group_{tp_group}\n",
                 "    tp_group_{tp_group->Split(0, 0)}\n", [CONCURRENCY],
                 id="a-communicator-split"),
    pytest.param("engine/moe/shared.py", "        self.stream = torch.cuda.Stream()\n",
                 "        self.__class__.stream = torch.cuda.Stream()\n"
                 "        self.stream = self.__class__.stream\n", [CONCURRENCY],
                 id="a-stream-re-owned"),
    pytest.param("csrc/io/handle.cpp", "    : io_handle_t(block_size, num_threads)\n",
                 "    : io_handle_t(block_size, 1)\n", [CONCURRENCY],
                 id="a-thread-count-dropped"),
    pytest.param("tests/unit/utilities.py", "        try:\n            dist.barrier()\n",
                 "        try:\n            torch.cuda.synchronize()\n            dist.barrier()\n",
                 [CONCURRENCY], id="a-test-harness-synchronises"),
    pytest.param("tests/unit/test_router.py", "    assert torch.allclose(a, b, **tols)\n",
                 "    if dtype == torch.float32:\n        tols = dict(rtol=2e-2, atol=1e-2)\n"
                 "    assert torch.allclose(a, b, **tols)\n", [NUMERICS],
                 id="a-tolerance-set-under-a-condition"),
    pytest.param("lib/ops/common.py", "ERROR_ATOL = {\n    torch.half: 0.1,\n}\n",
                 "ERROR_ATOL = {\n    torch.half: 0.2,\n}\n", [NUMERICS],
                 id="a-row-of-a-tolerance-table"),
    pytest.param("include/lib/bfloat16.h",
                 "  static T epsilon() { return T::bitcast(0x1000); }\n",
                 "  static T epsilon() { return T::bitcast(0x3c00); }\n", [NUMERICS],
                 id="a-number-formats-epsilon"),
    pytest.param("engine/utils.py", "    max_batch_size_map = {'a100': 256}\n",
                 "    max_batch_size_map = {'a100': 384}\n", [PRODUCTION],
                 id="a-serving-limit-under-an-affix"),
    pytest.param("engine/proxy/constants.py", "API_READ_TIMEOUT = 100\n",
                 "API_READ_TIMEOUT = 600\n", [PRODUCTION], id="an-http-timeout"),
    pytest.param("Dockerfile", "ARG X=1\n", "ARG X=1\nENV NVTE_BUILD_NUM_PHILOX_ROUNDS=3\n",
                 [NUMERICS, PRODUCTION], id="a-generators-rounds-in-an-image"),
    pytest.param("ci/jenkinsfile.groovy", 'img = "ci:1"\n', 'img = "ci:2"\n', [PRODUCTION],
                 id="a-jenkinsfile-of-any-suffix"),
    pytest.param("examples/model_configs/run.sh", 'OPTS="\\\n  --lr 1e-4 \\\n"\n',
                 'OPTS="\\\n  --lr 1e-4 \\\n  --use-fast \\\n"\n', [PRODUCTION],
                 id="an-option-line-of-a-script"),
])
def test_the_kinds_the_third_held_out_set_missed_are_classified(
        path: str, old: str, new: str, classes: list[str]) -> None:
    assert risk_classes(classify(unified(path, old, new))) == classes


@pytest.mark.parametrize(("path", "old", "new"), [
    pytest.param("csrc/comm/nccl.cu",
                 "        if (version >= NCCL_VERSION(2, 27, 0)) {\n            load();\n",
                 "        if (version >= NCCL_VERSION(2, 27, 0)) {\n"
                 "            if (version < NCCL_VERSION(2, 28, 0)) {\n"
                 '                TM_LOG_WARNING("leaks in 2.27");\n            }\n'
                 "            load();\n", id="a-c-branch-that-only-logs"),
    pytest.param("examples/cutedsl/reduce.py",
                 "    cute.arch.fence_proxy(\n        cute.arch.ProxyKind.async_shared,\n"
                 "        space=cute.arch.SharedSpace.shared_cta,\n    )\n",
                 '    cute.arch.fence_proxy("async.shared", space="cta")\n',
                 id="a-fence-respelled-with-strings"),
    pytest.param("ops/triton/copy.py",
                 "@triton.jit\ndef copy_kernel(\n    X,\n    BATCH: tl.constexpr,\n):\n",
                 "@triton.jit\ndef copy_kernel(\n    X,\n    BATCH,\n):\n",
                 id="a-kernel-parameter-no-longer-constexpr"),
])
def test_what_the_third_held_out_set_showed_harmless_stays_harmless(
        path: str, old: str, new: str) -> None:
    assert classify(unified(path, old, new)) == []


def test_environment_names_that_draw_numbers_or_switch_a_collective() -> None:
    assert draws_or_rounds("NVTE_BUILD_NUM_PHILOX_ROUNDS")
    assert draws_or_rounds("PYTHONHASHSEED")
    assert not draws_or_rounds("SEED_FILE_PATH")
    assert switches_collective("LIGHTLLM_PYNCCL_ENABLE")
    assert not switches_collective("NCCL_IB_HCA")


def test_a_barrier_argument_spelled_as_its_string_is_the_same_argument() -> None:
    assert _same_argument("cute.arch.ProxyKind.async_shared", '"async.shared"')
    assert _same_argument("SharedSpace.shared_cta", '"cta"')
    assert not _same_argument("SharedSpace.shared_cluster", '"cta"')
    assert not _same_argument("scope", '"cta"')


def test_a_hunk_that_opens_on_a_docstrings_last_line_is_read_as_code() -> None:
    lexed = lex_python(['    """', "    if x:", "        y = {'a': 256}"])

    assert lexed[2].code.strip().startswith("y = {")


# --- The fifth round: what the fourth held-out set showed (docs/risk.md) ---------------------


@pytest.mark.parametrize(("path", "old", "new"), [
    pytest.param("csrc/pythonInterface.cpp", "void f() {\n    g(NULL, a);\n}\n",
                 "void f() {\n    g(nullptr, a);\n}\n", id="NULL-spelled-nullptr"),
    pytest.param("src/impl/reduce_copy.h", "__device__ void f() {\n    acc[u] = cast(p);;\n}\n",
                 "__device__ void f() {\n    acc[u] = cast(p);\n}\n", id="an-empty-statement"),
    pytest.param("src/include/core.h", "ncclTeam_t ncclTeamWorld(ncclComm_t);\n",
                 "ncclTeam_t ncclTeamWorld(ncclComm_t comm);\n", id="a-parameter-named"),
    pytest.param("ops/amx/moe.hpp", 'void init() {\n    printf("Created AMX_BF16_MOE_TP\\n");\n}\n',
                 'void init() {\n    printf("Created BF16_MOE_TP\\n");\n}\n',
                 id="a-switch-named-in-a-printf"),
    pytest.param("model.py",
                 "def freqs(n: int) -> Tensor:\n    c = build(n)\n"
                 "    return c.to(dtype=torch.bfloat16)\n",
                 "def freqs(n: int,\n          dtype: torch.dtype = torch.bfloat16) -> Tensor:\n"
                 "    c = build(n)\n    return c.to(dtype=dtype)\n",
                 id="a-literal-made-a-new-parameters-default"),
    pytest.param("third_party/iqk_mul_mat.inc", "int f() {\n    // 中文\n    return 1;\n}\n",
                 "int f() {\n    // in English\n    return 1;\n}\n", id="a-comment-in-an-inc-file"),
    pytest.param("router/src/lib.rs",
                 'fn run() {\n    anyhow::bail!(\n        "too long ({} < {})",\n'
                 '        a,\n        b\n    );\n}\n',
                 'fn run() {\n    anyhow::bail!(\n        "too long: {a} < {b}"\n    );\n}\n',
                 id="a-rust-error-message-and-its-arguments"),
])
def test_what_the_fourth_held_out_set_showed_harmless_stays_harmless(
        path: str, old: str, new: str) -> None:
    assert classify(unified(path, old, new)) == []


@pytest.mark.parametrize(("path", "old", "new", "classes"), [
    pytest.param("tests/test_kv_cache.py", "tols = {\n    torch.half: (1e-2, 1e-2),\n}\n",
                 "tols = {\n    torch.half: (1.5e-2, 1.5e-2),\n}\n", [NUMERICS],
                 id="a-row-of-a-tols-table-loosened"),
    pytest.param("tests/test_functional.py", "assert err < ref + 1e-3\n",
                 "errtol = 1.2e-3 if cpu else 1e-3\nassert err < ref + errtol\n", [NUMERICS],
                 id="a-tolerance-under-a-joined-name"),
    pytest.param("tests/test_pipeline.py", "loss = run(model)\n",
                 "with common_cuda.tf32_off():\n    loss = run(model)\n", [NUMERICS],
                 id="tf32-turned-off-in-a-test"),
    pytest.param(".github/scripts/build-cuda.sh", 'build_capability="50;52;60;70"\n',
                 'build_capability="50;60;70"\n', [PRODUCTION], id="a-build-capability-list"),
    pytest.param("CMakeLists.txt", "if(BUILD_CUDA)\nendif()\n",
                 'if(BUILD_CUDA)\n    string(APPEND CMAKE_CUDA_FLAGS " --compress-mode=size")\n'
                 "endif()\n", [PRODUCTION], id="a-cmake-compiler-flag"),
    pytest.param("ext/stloader.cpp", "auto worker = [&] () {\n    copy();\n};\n",
                 "auto worker = [&] () {\n    cudaSetDevice(dev);\n    copy();\n};\n",
                 [CONCURRENCY], id="a-worker-thread-sets-its-device"),
    pytest.param("src/device/generate.py", 'src = (\n  "__global__ void k() {{\\n"\n  "}}"\n)\n',
                 'src = (\n  "__global__ void k() {{\\n"\n'
                 '  "  cudaGridDependencySynchronize();\\n"\n  "}}"\n)\n', [CONCURRENCY],
                 id="a-barrier-in-generated-cuda"),
    pytest.param("ext/cpp/sampling.cpp", "void s() {\n    pick(probs, random_s);\n}\n",
                 "void s() {\n    float r = random_s * 0.9998;\n    pick(probs, r);\n}\n",
                 [NUMERICS], id="a-samplers-random-point-scaled"),
    pytest.param("core/src/infer.rs", "fn f() {\n    std::thread::spawn(move || g());\n}\n",
                 "fn f() {\n    tokio::task::spawn_blocking(move || g());\n}\n", [CONCURRENCY],
                 id="a-rust-thread-made-a-blocking-task"),
    pytest.param("router/src/main.rs", "struct Args {\n    #[clap(long, env)]\n    t: bool,\n}\n",
                 'struct Args {\n    #[clap(long, env, default_value = "true")]\n    t: bool,\n}\n',
                 [PRODUCTION], id="a-rust-flags-default"),
    pytest.param("csrc/softmax.h", "void run() {\n    kernel<<<blocks, threads>>>(dst);\n}\n",
                 "void run() {\n    kernel<<<blocks, threads, 0, stream>>>(dst);\n}\n",
                 [CONCURRENCY], id="a-launch-given-a-stream"),
])
def test_what_the_fourth_held_out_set_showed_is_found(
        path: str, old: str, new: str, classes: list[str]) -> None:
    assert risk_classes(classify(unified(path, old, new))) == classes


def test_tokens_that_compile_to_the_same() -> None:
    def tokens(*lines: str) -> list[tuple[int, Token]]:
        return [(k, t) for k, line in enumerate(lex_c(list(lines))) for t in line.tokens]

    assert normal_tokens(tokens("f(NULL);;")) == normal_tokens(tokens("f(nullptr);"))
    assert normal_tokens(tokens("int f(T, U);")) == normal_tokens(tokens("int f(T t, U u);"))
    assert normal_tokens(tokens("for (;;) {")) != normal_tokens(tokens("for (;) {"))
    assert normal_tokens(tokens("return g(a, b);")) != normal_tokens(tokens("return g(a, c);"))
    assert normal_tokens(tokens("f(not a)")) != normal_tokens(tokens("f(not b)"))


def test_log_lines_and_the_arguments_of_a_log_macro() -> None:
    assert is_log_line('printf("x %d", y);')
    assert is_log_line('logger.info("x")')
    assert not is_log_line("y = printer(x)")
    assert log_arguments(["anyhow::bail!(", '    "msg {}",', "    a,", ");", "x = 1;"]) == {
        1, 2, 3}


def test_only_a_launchs_stream_changed() -> None:
    code = "k<<<g, b, 0, s>>>(x);"
    assert only_stream_changed(code, [(code.index(", 0"), code.index(">>>"))])
    assert not only_stream_changed(code, [(code.index("g"), code.index("g") + 1)])


def test_a_literal_made_a_parameters_default() -> None:
    lines = [DiffLine(REMOVED, 3, None, "    return c.to(dtype=torch.half)"),
             DiffLine(ADDED, None, 2, "    dtype: torch.dtype = torch.half,"),
             DiffLine(ADDED, None, 3, "    return c.to(dtype=dtype)")]
    lexed = lex_python([line.text for line in lines])
    assert hoisted_default(lines, lexed)
    other = [lines[0], lines[1], DiffLine(ADDED, None, 3, "    return c.to(dtype=torch.float)")]
    assert not hoisted_default(other, lex_python([line.text for line in other]))


# --- The sixth round: what the fifth held-out set showed (docs/risk.md) ----------------------
# Each family is tested on a spelling the corpus does not hold (another project's name for the
# same thing), so that a rule written for one example fails here.


def hunk(path: str, section: str, lines: list[str]) -> str:
    """A diff of one hunk whose header shows git's ``section`` (the enclosing function or type
    git found above the hunk); ``lines`` start with ' ', '-' or '+'."""
    old = sum(1 for line in lines if line[0] != "+")
    new = sum(1 for line in lines if line[0] != "-")
    body = "".join(line + "\n" for line in lines)
    return (f"diff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n"
            f"@@ -10,{old} +10,{new} @@ {section}\n{body}")


@pytest.mark.parametrize(("diff", "classes"), [
    # A call with template arguments covers its arguments (atomicLoad<int, scope>(...)).
    pytest.param(unified("include/ops/atomic_ops.h",
                         "inline void reset(int* p) {\n    atomicExch<int>(p, 0);\n}\n",
                         "inline void reset(int* p) {\n    atomicExch<int>(p, 1);\n}\n"),
                 [CONCURRENCY], id="a-template-calls-arguments"),
    # A wait by its words (spin, poll) in device code a project's qualifier macro marks.
    pytest.param(unified("include/mylib/wait.hpp",
                         "struct Waiter {\n  MYLIB_DEVICE_INLINE void wait(int phase) {\n"
                         "    spin_wait_until(ready_ == phase);\n  }\n};\n",
                         "struct Waiter {\n  MYLIB_DEVICE_INLINE void wait(int phase) {\n"
                         "    spin_wait_until(ready_ >= phase);\n  }\n};\n"),
                 [CONCURRENCY], id="a-spin-wait-in-device-code"),
    # A host thread's set-up moved past a CUDA runtime call (its device, its capture mode).
    pytest.param(unified("src/proxy.cc",
                         "void Proxy::run() {\n  worker_ = std::thread([this] {\n"
                         "    cudaStreamCreate(&stream_);\n    init_thread_context();\n"
                         "    loop();\n  });\n}\n",
                         "void Proxy::run() {\n  worker_ = std::thread([this] {\n"
                         "    init_thread_context();\n    cudaStreamCreate(&stream_);\n"
                         "    loop();\n  });\n}\n"),
                 [CONCURRENCY], id="set-up-moved-past-a-runtime-call"),
    # A statement moved into a stream's scope runs on that stream (not a softmax change).
    pytest.param(unified("model/attention.py",
                         "def step(lse, side):\n    lse = lse.squeeze(-1)\n"
                         "    with torch.cuda.stream(side):\n        out = combine(lse)\n"
                         "    return out\n",
                         "def step(lse, side):\n    with torch.cuda.stream(side):\n"
                         "        lse = lse.squeeze(-1)\n        out = combine(lse)\n"
                         "    return out\n"),
                 [CONCURRENCY], id="moved-into-a-streams-scope"),
    # A kernel whose qualifiers the hunk header shows, its name on the next line.
    pytest.param(hunk("src/pack.cuh", "__global__ void __launch_bounds__(128, 1)",
                      ["   const uint32_t v = in[i];", "-  out[i] = (v >> 3) & 0x7;",
                       "+  out[i] = (v >> 4) & 0xF;", " }"]),
                 [NUMERICS], id="kernel-qualifiers-in-the-hunk-header"),
    # A hunk of a function out of sight whose lines use threadIdx: device code.
    pytest.param(hunk("include/kern/reduce.h", "namespace kern",
                      ["     const int lane = threadIdx.x & 31;",
                       "-    int base = row * 64 + lane;", "+    int base = row * 128 + lane;",
                       "     out[base] = v;"]),
                 [NUMERICS], id="a-device-hunk-of-an-unseen-function"),
    # A CPU kernel: NEON intrinsics (the corpus has AVX-512 and AMX).
    pytest.param(unified("src/cpu/dot.cpp",
                         "float dot(const float* a, const float* b, int n) {\n"
                         "    float32x4_t acc = vdupq_n_f32(0.0f);\n"
                         "    for (int i = 0; i < n; i += 4) {\n"
                         "        acc = vfmaq_f32(acc, vld1q_f32(a + i), vld1q_f32(b + i));\n"
                         "    }\n    return vaddvq_f32(acc);\n}\n",
                         "float dot(const float* a, const float* b, int n) {\n"
                         "    float32x4_t acc = vdupq_n_f32(0.0f);\n"
                         "    for (int i = 0; i + 4 <= n; i += 4) {\n"
                         "        acc = vfmaq_f32(acc, vld1q_f32(a + i), vld1q_f32(b + i));\n"
                         "    }\n    return vaddvq_f32(acc);\n}\n"),
                 [NUMERICS], id="a-neon-cpu-kernels-loop-bound"),
    # An index widened (static_cast<int64_t>; the corpus has (size_t) and CuTe's Int64).
    pytest.param(unified("include/layout/gl.cuh",
                         "struct gl {\n    __device__ inline T& at(int r, int c) const {\n"
                         "        return ptr[r * cols + c];\n    }\n};\n",
                         "struct gl {\n    __device__ inline T& at(int r, int c) const {\n"
                         "        return ptr[static_cast<int64_t>(r) * cols + c];\n    }\n};\n"),
                 [NUMERICS], id="an-index-widened-by-static-cast"),
    # A signal in a collective's memory is ordering between GPUs, not arithmetic.
    pytest.param(unified("csrc/custom_allreduce.cuh",
                         "__device__ void publish(uint32_t* signals, uint32_t epoch) {\n"
                         "    signals[blockIdx.x] = epoch;\n}\n",
                         "__device__ void publish(uint32_t* signals, uint32_t epoch) {\n"
                         "    signals[blockIdx.x * 2] = epoch;\n}\n"),
                 [CONCURRENCY], id="a-signal-in-a-collectives-memory"),
    # A collective under a project's own name, its output buffer swapped.
    pytest.param(unified("csrc/ops.cpp",
                         "void forward(Tensor in) {\n"
                         "    custom_ar::allreduce_fused(stream, in, out_a);\n}\n",
                         "void forward(Tensor in) {\n"
                         "    custom_ar::allreduce_fused(stream, in, out_b);\n}\n"),
                 [CONCURRENCY], id="a-collective-by-a-projects-name"),
    # The dimension an operation works along (the corpus has torch.roll's dims).
    pytest.param(unified("model/rope.py", "def rot(x):\n    return torch.flip(x, dims=[1])\n",
                         "def rot(x):\n    return torch.flip(x, dims=[2])\n"),
                 [NUMERICS], id="a-flip-along-another-dim"),
    pytest.param(unified("model/heads.py", "def split(x):\n    return x.permute(0, 2, 1, 3)\n",
                         "def split(x):\n    return x.permute(0, 1, 2, 3)\n"),
                 [NUMERICS], id="a-permute-reordered"),
    # A float atomic whose operands changed; its memory ordering alone is concurrency only.
    pytest.param(unified("csrc/scatter.cu",
                         "__global__ void k(float* out, const float* v) {\n"
                         "    atomicAdd(&out[row], v[i]);\n}\n",
                         "__global__ void k(float* out, const float* v) {\n"
                         "    atomicAdd(&out[row * 2], v[i]);\n}\n"),
                 [CONCURRENCY, NUMERICS], id="an-atomic-adds-elsewhere"),
    pytest.param(unified("ops/acc.py", '@triton.jit\ndef k(p, v):\n'
                         '    tl.atomic_add(p, v, sem="release")\n',
                         '@triton.jit\ndef k(p, v):\n    tl.atomic_add(p, v, sem="relaxed")\n'),
                 [CONCURRENCY], id="an-atomics-ordering-only"),
    # A preprocessor condition judged by the code it selects.
    pytest.param(unified("csrc/reduce.cuh",
                         "__device__ float warp_sum(float v) {\n#if __CUDA_ARCH__ >= 700\n"
                         "    __syncwarp();\n#endif\n    return v;\n}\n",
                         "__device__ float warp_sum(float v) {\n#if __CUDA_ARCH__ >= 800\n"
                         "    __syncwarp();\n#endif\n    return v;\n}\n"),
                 [CONCURRENCY], id="an-arch-guard-over-a-warp-barrier"),
    pytest.param(unified("csrc/common.h",
                         "#if defined(__gfx90a__)\n#define ACC_TYPE float\n#else\n"
                         "#define ACC_TYPE half\n#endif\n",
                         "#if defined(__gfx90a__) || defined(__gfx942__)\n#define ACC_TYPE float\n"
                         "#else\n#define ACC_TYPE half\n#endif\n"),
                 [NUMERICS], id="an-arch-guard-over-an-accumulator-type"),
    # A macro's body on a line of its own, judged by the macro's name.
    pytest.param(unified("include/config.h", "#define USE_FAST_ROUNDING_PATH \\\n  (ARCH >= 90)\n",
                         "#define USE_FAST_ROUNDING_PATH \\\n  (ARCH >= 100)\n"),
                 [NUMERICS], id="a-rounding-macros-body"),
    # Code inside a synchronisation primitive (the corpus has DeviceSyncer and a semaphore).
    pytest.param(hunk("include/coop.cuh", "struct GridBarrier {",
                      ["   __device__ void arrive(unsigned int n) {",
                       "-    unsigned int target = n - 1;", "+    unsigned int target = n;",
                       "     wait_for(target);"]),
                 [CONCURRENCY], id="inside-a-grid-barrier"),
    # Where nothing else is found, a file's name says what its values decide.
    pytest.param(unified("csrc/passes/insert_fences.cc",
                         "void Visit(const Node* op) {\n  if (scope == kShared) {\n"
                         "    Emit(op);\n  }\n}\n",
                         "void Visit(const Node* op) {\n  if (scope != kShared) {\n"
                         "    Emit(op);\n  }\n}\n"),
                 [CONCURRENCY], id="a-pass-that-places-fences"),
    # A switch defined from the environment is production, whatever else the line is.
    pytest.param(unified("layers/moe.py", "def run(x):\n    return f(x)\n",
                         'def run(x):\n    use_bf16_acc = os.getenv("APP_BF16_ACC", "0") == "1"\n'
                         "    return f(x)\n"),
                 [NUMERICS, PRODUCTION], id="a-switch-read-from-the-environment"),
    pytest.param(unified("model/config.py",
                         "class Config:\n    def __init__(self):\n        self.use_cudnn = False\n",
                         "class Config:\n    def __init__(self):\n"
                         '        self.use_cudnn = os.getenv("APP_CUDNN", "0") == "1"\n'),
                 [PRODUCTION], id="a-kernel-switch-made-settable-its-default-kept"),
    # Build recipes: a platform condition, a kernel switch's default, linking in CMake.
    pytest.param(unified("setup.py", 'from setuptools import setup\nif sys.platform != "win32":\n'
                         "    ext.append(cpu_ext)\n",
                         'from setuptools import setup\n'
                         'if sys.platform not in ("win32", "darwin"):\n'
                         "    ext.append(cpu_ext)\n"),
                 [PRODUCTION], id="a-build-recipes-platform-condition"),
    pytest.param(unified("setup.py", 'from setuptools import setup\n'
                         'BUILD_FLASH = os.getenv("BUILD_FLASH", "0") == "1"\n',
                         'from setuptools import setup\n'
                         'BUILD_FLASH = os.getenv("BUILD_FLASH", "1") == "1"\n'),
                 [PRODUCTION], id="a-build-recipes-kernel-switch"),
    pytest.param(unified("CMakeLists.txt", "target_link_libraries(app PRIVATE -lcublas)\n",
                         "target_link_libraries(app PRIVATE ${CUBLAS_LIBRARIES})\n"),
                 [PRODUCTION], id="a-library-linked-in-cmake"),
    pytest.param(unified("cmake/deps.cmake", "set(X 1)\n",
                         "set(X 1)\nfind_package(MPI REQUIRED)\n"),
                 [PRODUCTION], id="a-package-found-in-cmake"),
    pytest.param(unified("src/core/env.cc", "Env::Env() : depth(16) {}\n",
                         'Env::Env() : depth(getEnv<int>("APP_CQ_DEPTH", 16)) {}\n'),
                 [PRODUCTION], id="an-environment-read-through-a-template-helper"),
    # Tests: tolerances rewritten as a tuple under other names.
    pytest.param(unified("tests/test_attn.py",
                         "def check(a, b):\n    atol = rtol = 1e-4\n"
                         "    assert_close(a, b, atol=atol, rtol=rtol)\n",
                         "def check(a, b):\n    grad_atol, grad_rtol = (1e-2, 1e-2)\n"
                         "    assert_close(a, b, atol=grad_atol, rtol=grad_rtol)\n"),
                 [NUMERICS], id="tolerances-rewritten-as-a-tuple"),
    # A tile size written as one word (the corpus has blocksize).
    pytest.param(unified("ops/scan.py", "def run(x, fast):\n    chunksize = 256 if fast else 128\n"
                         "    return scan(x, chunksize)\n",
                         "def run(x, fast):\n    chunksize = 256\n    return scan(x, chunksize)\n"),
                 [NUMERICS], id="a-chunksize-in-one-word"),
    # A dtype test over a conversion stays numerics (its bookkeeping twin is harmless below).
    pytest.param(unified("utils/convert.py",
                         "def prep(x, dtype):\n    if dtype == torch.float16:\n"
                         "        x = x.float()\n    return x\n",
                         "def prep(x, dtype):\n    if dtype in (torch.float16, torch.bfloat16):\n"
                         "        x = x.float()\n    return x\n"),
                 [NUMERICS], id="a-dtype-test-over-a-cast"),
])
def test_the_kinds_the_fifth_held_out_set_missed_are_classified(
        diff: str, classes: list[str]) -> None:
    assert risk_classes(classify(diff)) == classes


@pytest.mark.parametrize(("path", "old", "new"), [
    # A helper extracted from an expression, with a check (the corpus has a comprehension's
    # torch.cat and a forward split in two).
    pytest.param("quant/calib.py",
                 "class Calibrator:\n    def collect(self, d):\n"
                 "        out = {k: torch.stack(v) for k, v in d.items()}\n        return out\n",
                 "class Calibrator:\n    def collect(self, d):\n"
                 "        def stack_checked(k, v):\n"
                 '            assert v, f"{k} saw no batch"\n            return torch.stack(v)\n\n'
                 "        out = {k: stack_checked(k, v) for k, v in d.items()}\n"
                 "        return out\n",
                 id="a-helper-extracted-with-a-check"),
    pytest.param("kernels/pack.py", "def quantize_pack(w):\n    q = pack(w)\n    return q\n",
                 'def quantize_pack(w):\n    hint = f"set OMP_NUM_THREADS={8} before packing"\n'
                 "    logger.info(hint)\n    q = pack(w)\n    return q\n",
                 id="a-message-named-then-logged"),
    pytest.param("kernels/rms_norm.py",
                 "def patch_rms_norm():\n    try:\n        import apex\n    except:\n"
                 "        pass\n",
                 "def patch_rms_norm():\n    try:\n        import apex\n"
                 "    except (ImportError, AttributeError):\n        pass\n",
                 id="an-except-narrowed-in-a-norm"),
    pytest.param("serving/launch.py",
                 'def args(p):\n    p.add_argument(\n        "--log-dir",\n'
                 '        default="logs",\n        help="where logs are writen",\n    )\n',
                 'def args(p):\n    p.add_argument(\n        "--log-dir",\n'
                 '        default="logs",\n        help="where logs are written",\n    )\n',
                 id="a-launchers-help-text"),
    pytest.param("utils/memory.py",
                 "def itemsize(dtype):\n    if dtype == torch.float8_e5m2:\n        return 1\n"
                 "    return 2\n",
                 "def itemsize(dtype):\n"
                 "    if dtype in (torch.float8_e5m2, torch.float8_e4m3fnuz):\n"
                 "        return 1\n    return 2\n",
                 id="a-dtype-test-of-bookkeeping"),
    pytest.param("generate.py",
                 "def decode(model, x, use_graph=False):\n    if not use_graph:\n"
                 "        with torch.backends.cuda.sdp_kernel(enable_math=True):\n"
                 "            y = model(x)\n    else:\n        y = model(x)\n    return y\n\n\n"
                 "def main(model, x, use_graph=False):\n"
                 "    return decode(model, x, use_graph=use_graph)\n",
                 "def decode(model, x):\n"
                 "    with torch.backends.cuda.sdp_kernel(enable_math=True):\n"
                 "        y = model(x)\n    return y\n\n\n"
                 "def main(model, x):\n    return decode(model, x)\n",
                 id="an-option-removed-its-default-branch-kept"),
    pytest.param("kernels/matmul.py",
                 "def mm(a, b, block_size: int = 64, split_k: bool = False, out=None):\n"
                 "    return run(a, b, block_size, split_k, out)\n",
                 "def mm(\n    a,\n    b,\n    block_size: int = 64,\n    split_k: bool = False,\n"
                 "    out=None,\n    name=None,\n):\n"
                 "    return run(a, b, block_size, split_k, out)\n",
                 id="a-signature-rewrapped-its-sizes-kept"),
])
def test_what_the_fifth_held_out_set_showed_harmless_stays_harmless(
        path: str, old: str, new: str) -> None:
    assert classify(unified(path, old, new)) == []


def test_a_helper_that_computes_more_than_it_returns_is_a_change() -> None:
    old = ("class Calibrator:\n    def collect(self, d):\n"
           "        out = {k: torch.stack(v) for k, v in d.items()}\n        return out\n")
    new = ("class Calibrator:\n    def collect(self, d):\n"
           "        def stack_scaled(k, v):\n            s = torch.stack(v)\n"
           "            return s * 2\n\n"
           "        out = {k: stack_scaled(k, v) for k, v in d.items()}\n        return out\n")

    assert risk_classes(classify(unified("quant/calib.py", old, new))) != []


def test_a_rewrapped_signature_whose_size_changed_is_a_change() -> None:
    old = ("def mm(a, b, block_size: int = 64, split_k: bool = False, out=None):\n"
           "    return run(a, b, block_size, split_k, out)\n")
    new = ("def mm(\n    a,\n    b,\n    block_size: int = 128,\n    split_k: bool = False,\n"
           "    out=None,\n):\n    return run(a, b, block_size, split_k, out)\n")

    assert risk_classes(classify(unified("kernels/matmul.py", old, new))) == [NUMERICS]


def test_an_option_whose_non_default_branch_is_kept_is_a_change() -> None:
    old = ("def decode(model, x, use_math=False):\n    if use_math:\n"
           "        with torch.backends.cuda.sdp_kernel(enable_math=True):\n"
           "            return model(x)\n    return model(x)\n")
    new = ("def decode(model, x):\n"
           "    with torch.backends.cuda.sdp_kernel(enable_math=True):\n"
           "        return model(x)\n")

    assert NUMERICS in risk_classes(classify(unified("generate.py", old, new)))


# --- The seventh round: what the sixth held-out set showed (docs/risk.md) --------------------
# Each family on a spelling the corpus does not hold: another project's names, another
# language where the family has one.

SEVENTH_ROUND_RISKY = [
    # A test's thresholds are tolerances (`float grad_thresholds[N]` in llm.c; a C++ test here).
    pytest.param(unified("tests/attention_test.cpp",
                         "double max_thresholds[3] = {1e-3, 2e-3, 5e-3};\n",
                         "double max_thresholds[3] = {1e-3, 4e-3, 5e-3};\n"),
                 [NUMERICS], id="a-c-threshold-array-loosened"),
    # A tolerance table re-wrapped and reordered: an entry now gets a larger value.
    pytest.param(unified("tests/softmax_test.cc",
                         "const double eps_table[3] = {1e-6, 1e-4, 1e-3};\nrun(eps_table);\n",
                         "const double eps_table[3] = {\n    1e-4, 1e-6,\n    1e-3};\n"
                         "run(eps_table);\n"),
                 [NUMERICS], id="a-tolerance-table-reordered"),
    # An exact check made a bound (`==` -> `abs(a - b) < 10` in LMCache; gtest here).
    pytest.param(unified("tests/codec_test.cc",
                         "TEST(Codec, Size) {\n  EXPECT_EQ(out.size(), ref.size());\n}\n",
                         "TEST(Codec, Size) {\n  EXPECT_NEAR(out.size(), ref.size(), 4);\n}\n"),
                 [NUMERICS], id="an-exact-check-made-a-bound"),
    # A kernel launch's template sizes (threads, items per thread).
    pytest.param(hunk("src/kernels/rope_launch.cu",
                      "void rope_dispatch(Params& p, cudaStream_t s) {",
                      ["   if (p.dim <= 64) {",
                       "-    rope_kernel_launch<128, 8, T>(p, s);",
                       "+    rope_kernel_launch<256, 8, T>(p, s);",
                       "   }"]),
                 [NUMERICS], id="a-launch-templates-sizes"),
    # A slice of a forward pass: which elements are kept.
    pytest.param(hunk("rwkv/time_mix.py", "class TimeMix(nn.Module):",
                      ["         xx = self.shift(x)",
                       "-        xx = xx[:, 1:]",
                       "+        xx = xx[:, :-1]",
                       "         return xx"]),
                 [NUMERICS], id="a-slice-in-a-module"),
    # A check-then-create race closed (`exist_ok=True` in mamba; O_EXCL in C here).
    pytest.param(unified("src/spool/lockfile.c",
                         "int take(const char* p) {\n  return open(p, O_CREAT | O_WRONLY);\n}\n",
                         "int take(const char* p) {\n"
                         "  return open(p, O_CREAT | O_EXCL | O_WRONLY);\n}\n"),
                 [CONCURRENCY], id="a-create-made-exclusive"),
    pytest.param(unified("serving/cache_dir.py",
                         "def prepare(d):\n    Path(d).mkdir(parents=True)\n",
                         "def prepare(d):\n    Path(d).mkdir(parents=True, exist_ok=True)\n"),
                 [CONCURRENCY], id="a-directory-created-if-absent"),
    # Install commands: a conda pin dropped, a test script's pin changed.
    pytest.param(unified("tools/setup_env.sh", "conda install -y cudnn=8.9 nccl\n",
                         "conda install -y cudnn nccl\n"),
                 [PRODUCTION], id="a-conda-pin-dropped"),
    pytest.param(unified("tests/run_integration.sh",
                         'uv pip install "jax==0.4.30"\npytest tests/\n',
                         'uv pip install "jax>=0.4.30"\npytest tests/\n'),
                 [PRODUCTION], id="a-test-scripts-pin"),
    pytest.param(unified("setup.py",
                         'setup(\n    name="kern",\n    install_requires=[\n'
                         '        "flash-attn>=2.5",\n    ],\n)\n',
                         'setup(\n    name="kern",\n    install_requires=[\n'
                         '        "flash-attn>=2.5,<2.7",\n    ],\n)\n'),
                 [PRODUCTION], id="a-requirement-bounded-in-setup-py"),
    # A project's CI folder (its job matrix).
    pytest.param(unified("ci/run_unit.sh", "ctest -L unit --output-on-failure\n",
                         "ctest -L 'unit|gpu' --output-on-failure\n"),
                 [PRODUCTION], id="a-ci-folders-script"),
    # A memory-ordering mode's default.
    pytest.param(unified("src/transport/rdma_context.cc",
                         "static int relaxed_ordering = 0;\n",
                         "static int relaxed_ordering = 1;\n"),
                 [CONCURRENCY], id="a-relaxed-ordering-mode"),
    # A default of the service's configuration: a field of its config file, a named default.
    pytest.param(unified("src/store/store_config.h",
                         "struct StoreConfig {\n  uint32_t eviction_interval_ms = 500;\n};\n",
                         "struct StoreConfig {\n  uint32_t eviction_interval_ms = 1000;\n};\n"),
                 [PRODUCTION], id="a-config-structs-default"),
    pytest.param(unified("src/server/queue.cc", "static constexpr int kDefaultQueueDepth = 64;\n",
                         "static constexpr int kDefaultQueueDepth = 128;\n"),
                 [PRODUCTION], id="a-named-default"),
    # Host reads of GPU values re-batched: one .tolist() for per-element .item() calls.
    pytest.param(hunk("layers/moe_router.py", "def route(self, counts):",
                      ["-        sizes = [int(c.item()) for c in counts]",
                       "+        sizes = counts.tolist()",
                       "         return sizes"]),
                 [CONCURRENCY], id="host-reads-rebatched"),
    # A residual sum into the hidden state.
    pytest.param(hunk("layers/block.py", "def forward(self, h, shortcut):",
                      ["-        h = self.mixer(h)",
                       "+        h = self.mixer(h) + shortcut",
                       "         return h"]),
                 [NUMERICS], id="a-residual-sum"),
    # A compute-capability test over a precision path.
    pytest.param(hunk("src/gpu/caps.cc", "namespace gpu {",
                      ["   bool supports_fp8(int dev) {",
                       "     const auto& prop = props(dev);",
                       "-    return prop.major >= 9;",
                       "+    return prop.major > 8 || (prop.major == 8 && prop.minor >= 9);",
                       "   }"]),
                 [NUMERICS, PRODUCTION], id="a-capability-test-over-fp8"),
    # A grid's size in host code: a ceil division covers the tail.
    pytest.param(hunk("src/ops/scan_host.cpp", "void scan(Tensor& t, cudaStream_t s) {",
                      ["-  dim3 blocks(n / 256);",
                       "+  dim3 blocks((n + 255) / 256);",
                       "   scan_kernel<<<blocks, 256, 0, s>>>(t.data(), n);"]),
                 [NUMERICS], id="a-grid-rounded-up"),
    # A buffer kept alive until the command buffer completes, now on one branch only.
    pytest.param(hunk("backend/metal/conv.cpp", "void conv_general(Encoder& enc) {",
                      ["   } else {",
                       "     copies.push_back(make_copy(in));",
                       "+    enc.add_temporaries(std::move(copies));",
                       "   }",
                       "-  enc.add_temporaries(std::move(copies));"]),
                 [CONCURRENCY], id="a-temporarys-life"),
    # Code inside a C++ critical section (a shared lock guarding a map's operator[]).
    pytest.param(hunk("src/cache/registry.cc", "Entry* Registry::lookup(const Key& key) {",
                      ["   std::shared_lock<std::shared_mutex> guard(mu_);",
                       "-  auto& entry = table_[key];",
                       "-  return entry.get();",
                       "+  auto it = table_.find(key);",
                       "+  return it == table_.end() ? nullptr : it->second.get();",
                       " }"]),
                 [CONCURRENCY], id="inside-a-lock-guard"),
    # A distributed tensor's placements.
    pytest.param(hunk("parallel/plan.py", "def tp_plan(model):",
                      ["     out = ColwiseParallel(",
                       "-        output_layouts=Replicate(),",
                       "+        output_layouts=Shard(1),",
                       "     )"]),
                 [CONCURRENCY, NUMERICS], id="a-dtensor-placement"),
    # A condition on the rank over a value (a bias added on one rank only).
    pytest.param(hunk("layers/row_linear.py", "def forward(self, x):",
                      ["         y = self.gemm(x)",
                       "-        if dist.get_rank() > 0:",
                       "+        if dist.get_rank() == 0:",
                       "             y = y + self.bias",
                       "         return y"]),
                 [NUMERICS], id="a-rank-condition-over-a-bias"),
    # A command-line default of a Rust service (clap's default_value_t).
    pytest.param(unified("router/src/config.rs",
                         "struct Args {\n    #[arg(long, default_value_t = 512)]\n"
                         "    max_waiting: usize,\n}\n",
                         "struct Args {\n    #[arg(long, default_value_t = 1024)]\n"
                         "    max_waiting: usize,\n}\n"),
                 [PRODUCTION], id="a-clap-default"),
    # A function named as a kernel in CUDA source, its __global__ out of the hunk's sight.
    pytest.param(hunk("csrc/rotary.cu", "void rotary_embedding_kernel(const float* x, float* y) {",
                      ["-  y[i] = x[i] * c - x[j] * s;",
                       "+  y[i] = x[i] * c + x[j] * s;"]),
                 [NUMERICS], id="a-kernel-by-its-name"),
    # A brace cast dropped from a byte offset (which width it is computed in).
    pytest.param(hunk("src/kernels/gather_host.cc", "size_t offset_of(int64_t n, int elem) {",
                      ["-  return n * int64_t{elem};",
                       "+  return n * elem;"]),
                 [NUMERICS], id="a-brace-cast"),
    # In a lock's own code, a width is a ticket's: concurrency only.
    pytest.param(hunk("include/sync/ticket_mutex.h", "class TicketMutex {",
                      ["   void lock() {",
                       '     asm volatile("" ::: "memory");',
                       "-    uint16_t t = __atomic_fetch_add(&next_, 1, __ATOMIC_ACQUIRE);",
                       "+    uint32_t t = static_cast<uint32_t>(",
                       "+        __atomic_fetch_add(&next_, 1, __ATOMIC_ACQ_REL));",
                       "   }"]),
                 [CONCURRENCY], id="a-width-in-a-locks-code"),
    # A count of host threads (a flag's default): since the ninth round a flag is also a
    # setting production is launched with (the eighth held-out set labelled two such so).
    pytest.param(hunk("src/server/main_flags.cc", "namespace {",
                      ["-DEFINE_uint32(io_threads, 8, \"I/O threads\");",
                       "+DEFINE_uint32(io_threads, 16, \"I/O threads\");"]),
                 [CONCURRENCY, PRODUCTION], id="a-host-thread-count"),
]


@pytest.mark.parametrize(("diff", "classes"), SEVENTH_ROUND_RISKY)
def test_what_the_sixth_held_out_set_showed(diff: str, classes: list[str]) -> None:
    assert risk_classes(classify(diff)) == classes


SEVENTH_ROUND_HARMLESS = [
    # A page of prose under a deployment folder documents; it deploys nothing.
    pytest.param(unified("deployment/guides/scaling.md", "Default TTL: 5 s.\n",
                         "Default TTL: 10 s.\n"), id="docs-in-a-deployment-folder"),
    # A setter's call dropped where the next statement sets the same again.
    pytest.param(hunk("train/env.py", "def configure():",
                      ["-    torch.set_float32_matmul_precision(\"high\")",
                       "     torch.set_float32_matmul_precision(\"high\")",
                       "     return True"]),
                 id="a-repeated-setter-dropped"),
    # Chunks materialised: the same items, no size.
    pytest.param(hunk("layers/kv_store.py", "def put(self, chunk_list):",
                      ["+        chunk_list = list(chunk_list)",
                       "         for c in chunk_list:",
                       "             self.q.append(c)"]),
                 id="chunks-materialised"),
]


@pytest.mark.parametrize("diff", SEVENTH_ROUND_HARMLESS)
def test_what_the_sixth_held_out_set_showed_harmless_stays_harmless(diff: str) -> None:
    assert classify(diff) == []


def test_a_host_read_with_no_read_rewritten_is_no_wait() -> None:
    # A seed drawn on the CPU and read with .item(): no GPU read is batched or unbatched.
    diff = hunk("layers/dropout_seed.py", "def seed(self):",
                ["+        s = int(torch.empty((), dtype=torch.int64).random_().item())",
                 "         return s"])

    assert CONCURRENCY not in risk_classes(classify(diff))


# --- The eighth round: what the seventh held-out set showed (docs/risk.md) --------------------
# Each case spells its family in a way the corpus does not hold, and fails without the rule.

EIGHTH_ROUND_RISKY = [
    # Dependency pins: a requirement of a service's requirements file, pinned anew.
    pytest.param(unified("serving/requirements-gpu.txt", "vllm>=0.5\nxformers\n",
                         "vllm==0.6.3\nxformers\n"),
                 [PRODUCTION], id="a-requirement-pinned"),
    # A crate's git dependency pinned to a commit in a Cargo.toml.
    pytest.param(unified("router/Cargo.toml", "[dependencies]\ntokio = \"1\"\n"
                         "hf-hub = { git = \"https://github.com/x/hf-hub\" }\n",
                         "[dependencies]\ntokio = \"1\"\n"
                         "hf-hub = { git = \"https://github.com/x/hf-hub\", rev = \"ab12cd\" }\n"),
                 [PRODUCTION], id="a-cargo-git-dependency-pinned"),
    # Metal host code in Go (no analyser): a wait on a command buffer added.
    pytest.param(unified("gpu/metal/readback.go",
                         "func Read(cb *CommandBuffer) []float32 {\n\treturn copyOut(cb)\n}\n",
                         "func Read(cb *CommandBuffer) []float32 {\n\tcb.WaitUntilCompleted()\n"
                         "\treturn copyOut(cb)\n}\n"),
                 [CONCURRENCY], id="a-go-wait-until-completed"),
    # Rust host code: a causal flag given another value.
    pytest.param(unified("src/attention/flash.rs",
                         "fn run(a: &Args) {\n    let is_causal = a.causal;\n}\n",
                         "fn run(a: &Args) {\n"
                         "    let is_causal = a.causal && a.mask.is_none();\n}\n"),
                 [NUMERICS], id="a-rust-causal-flag"),
    # Rust host code: fast math switched through a compile option.
    pytest.param(unified("src/backend/compile.rs",
                         "fn opts(o: &Options) {\n    o.set_opt_level(3);\n}\n",
                         "fn opts(o: &Options) {\n    o.set_opt_level(3);\n"
                         "    o.set_fast_math_enabled(false);\n}\n"),
                 [NUMERICS], id="a-rust-fast-math-option"),
    # Rust host code: a lock taken around a readback.
    pytest.param(unified("src/backend/device.rs",
                         "fn read(&self) -> Vec<f32> {\n    self.copy_out()\n}\n",
                         "fn read(&self) -> Vec<f32> {\n    let _g = self.queue.lock();\n"
                         "    self.copy_out()\n}\n"),
                 [CONCURRENCY], id="a-rust-lock-around-a-readback"),
    # Rust host code: an environment switch read.
    pytest.param(unified("src/backend/flags.rs",
                         "fn tf32() -> bool {\n    true\n}\n",
                         "fn tf32() -> bool {\n    std::env::var(\"MY_TF32\").is_ok()\n}\n"),
                 [PRODUCTION], id="a-rust-env-switch"),
    # A project's own barrier in a header with no device marks in sight.
    pytest.param(unified("include/mylib/ops/block_reduce.hpp",
                         "    Reduce(buf, v);\n    Store(out, v);\n",
                         "    Reduce(buf, v);\n    wg_sync_shared();\n    Store(out, v);\n"),
                 [CONCURRENCY], id="a-projects-own-barrier"),
    # A timeout spelled as a duration type.
    pytest.param(unified("src/cpu_comm.cpp",
                         "    if (waited > std::chrono::seconds(5)) abort_wait();\n",
                         "    if (waited > std::chrono::seconds(30)) abort_wait();\n"),
                 [CONCURRENCY], id="a-chrono-timeout"),
    # A transport setting set through a configuration call; ordering words make it
    # concurrency too.
    pytest.param(unified("src/transport/ucx_ctx.cc",
                         "    cfg.set(\"NUM_EPS\", \"4\");\n",
                         "    cfg.set(\"NUM_EPS\", \"4\");\n"
                         "    cfg.set(\"TM_THREAD_MODE\", \"multi\");\n"),
                 [CONCURRENCY, PRODUCTION], id="a-transport-threading-set-by-call"),
    pytest.param(unified("src/transport/ucx_ctx.cc",
                         "    cfg.set(\"NUM_EPS\", \"4\");\n",
                         "    cfg.set(\"NUM_EPS\", \"8\");\n"),
                 [PRODUCTION], id="a-transport-setting-set-by-call"),
    # An exit added above a block-wide reduction helper: the threads that leave never reach
    # its barrier.
    pytest.param(hunk("csrc/rmsnorm.cu", "__global__ void rms_kernel(const float* x) {",
                      ["   float v = x[row * cols + threadIdx.x];",
                       "+  if (row >= rows) return;",
                       "   float s = blockReduceSum<float>(v * v);",
                       "   out[row] = s;"]),
                 [CONCURRENCY], id="an-exit-above-a-block-reduction"),
    # A compiler barrier: an inline asm's memory clobber added.
    pytest.param(hunk("src/ring/spsc_queue.cpp", "void SpscQueue::publish(uint64_t t) {",
                      ["-  __asm__ __volatile__(\"\" : : : \"cc\");",
                       "+  __asm__ __volatile__(\"\" : : : \"cc\", \"memory\");",
                       "   tail_ = t;"]),
                 [CONCURRENCY], id="an-asm-memory-clobber"),
    # An instruction-set flag in a CMake file: FMA contraction (numerics) and the binary.
    pytest.param(unified("cmake/cpu_flags.cmake",
                         "target_compile_options(core PRIVATE\n  -O3)\n",
                         "target_compile_options(core PRIVATE\n  -O3\n  -mno-fma)\n"),
                 [NUMERICS, PRODUCTION], id="an-fma-flag-in-cmake"),
    # A macro with a locking word defined for the compiler.
    pytest.param(unified("CMakeLists.txt", "project(x)\nset(CMAKE_CXX_FLAGS \"-O3\")\n",
                         "project(x)\nset(CMAKE_CXX_FLAGS \"-O3 -DUSE_SPIN_LOCK\")\n"),
                 [CONCURRENCY, PRODUCTION], id="a-locking-define"),
    # A count rounded up where it was rounded down.
    pytest.param(hunk("src/engine/scheduler.cc", "int Scheduler::blocks(int n) const {",
                      ["-  return n / kBlock;",
                       "+  return DIV_ROUND_UP(n, kBlock);",
                       " }"]),
                 [NUMERICS], id="a-count-rounded-up"),
    # A getter named after a collective reads a setting; it runs no collective: the upcast
    # dropped under it is what changes.
    pytest.param(hunk("apex/transformer/tensor_parallel/mappings.py",
                      "def _gather_along_last_dim(input_):",
                      ["-    if input_.dtype == torch.float16 and use_fp32_all_reduce():",
                       "-        input_ = input_.float()",
                       "     return input_"]),
                 [NUMERICS], id="an-upcast-under-a-getter-named-after-a-collective"),
    # A build file's arguments are values, not a declaration's parameter names: a define or
    # a library added after another is a change of the binary.
    pytest.param(unified("CMakeLists.txt", "project(x)\nadd_compile_options(-DUSE_NUMA)\n",
                         "project(x)\nadd_compile_options(-DUSE_NUMA -DUSE_HUGEPAGES)\n"),
                 [PRODUCTION], id="a-define-added-after-another"),
    pytest.param(unified("src/CMakeLists.txt", "target_link_libraries(engine nccl)\n",
                         "target_link_libraries(engine nccl ibverbs)\n"),
                 [PRODUCTION], id="a-library-linked-after-another"),
]


@pytest.mark.parametrize(("diff", "classes"), EIGHTH_ROUND_RISKY)
def test_what_the_seventh_held_out_set_showed(diff: str, classes: list[str]) -> None:
    assert risk_classes(classify(diff)) == classes


EIGHTH_ROUND_HARMLESS = [
    # A linter's pin in a tooling requirements file installs nothing production runs.
    pytest.param(unified("requirements/lint.txt", "black==23.1\n", "black==24.3\n"),
                 id="a-linters-pin"),
    # A lock file is generated from the manifest, which is read.
    pytest.param(unified("Cargo.lock", "version = \"0.19.4\"\n", "version = \"0.19.8\"\n"),
                 id="a-lock-file"),
    # A Cargo.toml's own version is a release, not a dependency.
    pytest.param(unified("crate/Cargo.toml", "[package]\nversion = \"0.1.0\"\n",
                         "[package]\nversion = \"0.1.1\"\n"),
                 id="a-packages-own-version"),
    # A cast inside a debug assertion: compiled out of release builds.
    pytest.param(hunk("csrc/kernels/gemm_dump.cuh", "__device__ void dump(const T* p, int n) {",
                      ["   for (int i = 0; i < 8; i++) {",
                       "-    DCHECK_LT(base + i, n);",
                       "+    DCHECK_LT(static_cast<int64_t>(base + i), n);",
                       "   }"]),
                 id="a-cast-in-a-debug-assert"),
    # A getter named after a collective reads a setting; it runs no collective.
    pytest.param(hunk("megatron/mpu/layers.py", "def forward(self, x):",
                      ["-    if use_fused_all_gather():",
                       "+    if x.is_cuda and use_fused_all_gather():",
                       "         x = x.contiguous()"]),
                 id="a-getter-named-after-a-collective"),
]


@pytest.mark.parametrize("diff", EIGHTH_ROUND_HARMLESS)
def test_what_the_seventh_held_out_set_showed_harmless_stays_harmless(diff: str) -> None:
    assert classify(diff) == []


# --- The ninth round: what the eighth held-out set showed (docs/risk.md) ---------------------
# Each case spells its family in a way the corpus does not hold (another repository's
# language, names and files); each risky case fails on the rules before the ninth round.

NINTH_ROUND_RISKY = [
    # A parallel region's clause changed: how its iterations are shared among threads.
    pytest.param(hunk("src/cpu/gemm_kernels.cpp", "void pack_b(const float* b, int n) {",
                      ["-  #pragma omp parallel for schedule(dynamic, 4) collapse(2)",
                       "+  #pragma omp parallel for schedule(static)",
                       "   for (int i = 0; i < n; ++i) {"]),
                 [CONCURRENCY], id="an-openmp-schedule-clause"),
    # A kernel switch flipped in a JSON configuration: which kernel computes the numbers.
    pytest.param(unified("configs/serving.json", '{\n  "enable_flash_attn": true\n}\n',
                         '{\n  "enable_flash_attn": false\n}\n'),
                 [NUMERICS, PRODUCTION], id="a-kernel-switch-in-json"),
    # A requirement pinned in a pyproject.toml's optional dependencies (an extra).
    pytest.param(unified("pyproject.toml",
                         '[project.optional-dependencies]\nserve = ["vllm>=0.5"]\n',
                         '[project.optional-dependencies]\nserve = ["vllm>=0.5,<0.7"]\n'),
                 [PRODUCTION], id="a-requirement-pinned-in-an-extra"),
    # The version of what a build pulls, as a module constant of a build script.
    pytest.param(unified("tools/build_wheel.py", 'TENSORRT_VERSION = "10.1.0"\n',
                         'TENSORRT_VERSION = "10.3.0"\n'),
                 [PRODUCTION], id="a-pulled-version-in-a-build-script"),
    # A thread count declared as a flag: how many run at once, set where production launches.
    pytest.param(hunk("serve/entrypoint.py", "def build_parser():",
                      ['-    parser.add_argument("--num-workers", type=int, default=4)',
                       '+    parser.add_argument("--num-workers", type=int, default=8)']),
                 [CONCURRENCY, PRODUCTION], id="a-thread-count-option"),
    # The compute capabilities setup.py builds for, computed another way.
    pytest.param(hunk("setup.py", "def archs(caps):",
                      ["-    return [int(capability[0]) * 10 for capability in caps]",
                       "+    return [int(float(capability) * 10) for capability in caps]"]),
                 [PRODUCTION], id="a-capability-computed-in-setup-py"),
    # Go: a wait group and a goroutine, read as the native languages' threads are.
    pytest.param(hunk("internal/scheduler/pool.go", "func (p *Pool) Run(jobs []Job) {",
                      [" \tfor _, j := range jobs {",
                       "-\t\tp.run(j)",
                       "+\t\twg.Add(1)",
                       "+\t\tgo p.runAndSignal(j, &wg)",
                       " \t}",
                       "+\twg.Wait()"]),
                 [CONCURRENCY], id="a-goroutine-and-wait-group-in-go"),
]


@pytest.mark.parametrize(("diff", "classes"), NINTH_ROUND_RISKY)
def test_what_the_eighth_held_out_set_showed(diff: str, classes: list[str]) -> None:
    assert risk_classes(classify(diff)) == classes


NINTH_ROUND_HARMLESS = [
    # A JUnit test's constant: test code, not a foreign language to flag.
    pytest.param(unified("qa/L0_java_client/InferTest.java",
                         "  static final int RETRIES = 3;\n", "  static final int RETRIES = 5;\n"),
                 id="a-junit-tests-constant"),
    # A package's own version is a release, not what a build pulls.
    pytest.param(unified("mypkg/__init__.py", '__version__ = "1.2.0"\n',
                         '__version__ = "1.2.1"\n'),
                 id="a-packages-own-dunder-version"),
    # A tooling extra's comment in pyproject.toml: no requirement changed.
    pytest.param(unified("pyproject.toml", '[project]\n# runtime deps below\n',
                         '[project]\n# runtime dependencies below\n'),
                 id="a-comment-in-pyproject"),
    # A Go comment that names a mutex: only the comment changes.
    pytest.param(hunk("internal/cache/store.go", "func (s *Store) Get(k string) string {",
                      ["-\t// the caller holds s.mu.Lock()",
                       "+\t// the caller must hold s.mu.Lock()",
                       " \treturn s.m[k]"]),
                 id="a-go-comment-naming-a-lock"),
]


@pytest.mark.parametrize("diff", NINTH_ROUND_HARMLESS)
def test_what_the_eighth_held_out_set_showed_harmless_stays_harmless(diff: str) -> None:
    assert classify(diff) == []


# --- The tenth round: what the ninth held-out set showed (docs/risk.md) ----------------------
# Each case spells its family in a way the corpus does not hold (another repository's
# language, names and files); each risky case fails on the rules before the tenth round.

TENTH_ROUND_RISKY = [
    # The groups a producer's collectives met in, no longer created: they share another.
    pytest.param(hunk("trainer/weights_sync.py", "    def setup(self):",
                      ["-        for i in range(self.n):",
                       '-            collective.init_collective_group(self.n + 1, 0, '
                       'group_name=f"eval_{i}")',
                       "         self.ready = True"]),
                 [CONCURRENCY], id="communicator-groups-no-longer-created"),
    # A remote result now waited for: the caller blocks on another worker.
    pytest.param(hunk("rollout/controller.py", "    def steps(self):",
                      ["-        return self.actor.num_steps.remote()",
                       "+        return ray.get(self.actor.num_steps.remote())"]),
                 [CONCURRENCY], id="a-remote-result-waited-for"),
    # An event loop made re-entrant before the server starts.
    pytest.param(hunk("server/app.py", "def main():",
                      ["+    nest_asyncio.apply()",
                       "     server.start(models)"]),
                 [CONCURRENCY], id="an-event-loop-made-re-entrant"),
    # Worker threads pinned to the cores of one NUMA node.
    pytest.param(hunk("runtime/threads.cc", "void Pool::Start() {",
                      ["-  for (auto& w : workers_) w.Run();",
                       "+  for (size_t i = 0; i < workers_.size(); ++i)",
                       "+    workers_[i].Run(numa_cores[i % numa_cores.size()]);"]),
                 [CONCURRENCY], id="threads-pinned-to-numa-cores"),
    # A parallel loop split into other tasks.
    pytest.param(hunk("ops/pack.cc", "void PackRows(const Mat& m, ThreadPool& pool) {",
                      ["-  ParallelFor(m.rows, pool, [&](size_t r) { PackRow(m, r); });",
                       "+  ParallelFor(DivCeil(m.rows, 4), pool, [&](size_t t) { P4(m, t); });"]),
                 [CONCURRENCY], id="a-parallel-loop-split-otherwise"),
    # A seed now passed to a sampler: which examples come in which order.
    pytest.param(hunk("data/loader.py", "    def train_loader(self):",
                      ["-        sampler = Sampler(self.ds, shuffle=True)",
                       "+        sampler = Sampler(self.ds, shuffle=True, seed=self.seed)"]),
                 [NUMERICS], id="a-seed-passed-to-a-sampler"),
    # RoPE's theta set in a model's preset.
    pytest.param(hunk("models/presets.py", "QWEN_7B = dict(",
                      ["     n_layer=28,",
                       "+    rope_theta=1_000_000.0,"]),
                 [NUMERICS], id="a-rope-theta-in-a-preset"),
    # A default temperature changed in a YAML generation config.
    pytest.param(unified("configs/generation.yaml", "max_new_tokens: 256\ntemperature: 0.8\n",
                         "max_new_tokens: 256\ntemperature: 0.6\n"),
                 [NUMERICS], id="a-default-temperature-in-yaml"),
    # When a request is sampled rather than decoded greedily, decided otherwise.
    pytest.param(hunk("serve/handlers.py", "def choose(self, logits, req):",
                      ["-    if req.temperature > 0.0 or req.top_p < 1.0:",
                       "+    if req.temperature > 0.0 and req.top_p < 1.0:",
                       "         return self.draw(logits, req)"]),
                 [NUMERICS], id="a-condition-on-sampling-parameters"),
    # The C++ standard a CMake build compiles with.
    pytest.param(unified("CMakeLists.txt", "set(CMAKE_CXX_STANDARD 17)\n",
                         "set(CMAKE_CXX_STANDARD 20)\n"),
                 [PRODUCTION], id="the-cxx-standard-of-a-build"),
    # A C++ test's bound raised: it lets more error pass.
    pytest.param(hunk("tests/gemm_test.cc", "TEST(Gemm, Bf16) {",
                      ["-  EXPECT_NEAR(max_err, 0.0, 2e-3);",
                       "+  EXPECT_NEAR(max_err, 0.0, 5e-3);"]),
                 [NUMERICS], id="a-cpp-test-bound-raised"),
    # A Python test's floor lowered: it lets a worse accuracy pass.
    pytest.param(hunk("tests/test_eval.py", "def test_accuracy():",
                      ["-    assert acc >= 0.92",
                       "+    assert acc >= 0.90"]),
                 [NUMERICS], id="a-python-test-floor-lowered"),
    # Cancellation checked in Rust's async server loop (a language read for comments only).
    pytest.param(hunk("src/server/stream.rs", "async fn stream(ctx: Ctx) -> Result<()> {",
                      ["     loop {",
                       "+        if token.is_cancelled() { break; }",
                       "         let chunk = next().await?;"]),
                 [CONCURRENCY], id="cancellation-checked-in-rust"),
    # DDP's gradient sync deferred during accumulation.
    pytest.param(hunk("train/step.py", "def micro_step(model, batch, last):",
                      ["-    loss = model(batch).loss",
                       "+    with (contextlib.nullcontext() if last else model.no_sync()):",
                       "+        loss = model(batch).loss"]),
                 [CONCURRENCY], id="gradient-sync-deferred"),
    # The collective backend a launch script passes.
    pytest.param(unified("scripts/launch_rl.sh", "python train.py \\\n  --dist_backend nccl\n",
                         "python train.py \\\n  --dist_backend gloo\n"),
                 [CONCURRENCY, PRODUCTION], id="a-collective-backend-in-a-launch-script"),
]


@pytest.mark.parametrize(("diff", "classes"), TENTH_ROUND_RISKY)
def test_what_the_ninth_held_out_set_showed(diff: str, classes: list[str]) -> None:
    assert risk_classes(classify(diff)) == classes


TENTH_ROUND_HARMLESS = [
    # A test's tolerance tightened: it lets less pass.
    pytest.param(hunk("tests/test_norm.py", "def test_rmsnorm():",
                      ["-    torch.testing.assert_close(y, ref, atol=1e-3, rtol=1e-3)",
                       "+    torch.testing.assert_close(y, ref, atol=1e-4, rtol=1e-4)"]),
                 id="a-test-tolerance-tightened"),
    # A log call whose arguments name a NUMA node over several lines.
    pytest.param(hunk("runtime/pool.cc", "void Pool::Report() {",
                      ['-  printf("pool ready\\n");',
                       '+  printf("pool ready on node %d, cpu %d\\n",',
                       "+         numa_node_of_cpu(sched_getcpu()), sched_getcpu());"]),
                 id="a-log-call-naming-a-numa-node"),
    # A seed's keyword moved onto its own line with the same value: a re-wrap.
    pytest.param(hunk("data/loader.py", "    def loader(self):",
                      ["-        return Loader(self.ds, shuffle=True, seed=self.seed)",
                       "+        return Loader(",
                       "+            self.ds, shuffle=True, seed=self.seed",
                       "+        )"]),
                 id="a-seed-keyword-re-wrapped"),
    # A flag list gained an unrelated flag beside an unchanged language standard.
    pytest.param(unified("CMakeLists.txt", 'set(FLAGS "-std=c++17 -Wall")\n',
                         'set(FLAGS "-std=c++17 -Wall -Wextra")\n'),
                 id="a-warning-flag-beside-an-unchanged-standard"),
    # A compile-time check added to a kernel: the compiler checks it, nothing runs.
    pytest.param(hunk("csrc/sampling/topk.cu", "__global__ void TopKKernel(const float* x) {",
                      ["+  static_assert(kThreads % 32 == 0, \"whole warps\");",
                       "   float v = x[threadIdx.x];"]),
                 id="a-static-assert-in-a-kernel"),
    # A comment about cancellation in Rust.
    pytest.param(hunk("src/server/stream.rs", "async fn stream(ctx: Ctx) -> Result<()> {",
                      ["-    // stops when the token is cancelled",
                       "+    // stops once the token is_cancelled()"]),
                 id="a-rust-comment-on-cancellation"),
]


@pytest.mark.parametrize("diff", TENTH_ROUND_HARMLESS)
def test_what_the_ninth_held_out_set_showed_harmless_stays_harmless(diff: str) -> None:
    assert classify(diff) == []


# --- The eleventh round: what the tenth held-out set showed (docs/risk.md) -------------------
# Each case spells its family in a way the corpus does not hold; each risky case fails on the
# rules before the eleventh round.

ELEVENTH_ROUND_RISKY = [
    # Rust: a lock's guard dropped before the branch, not held through it.
    pytest.param(hunk("src/engine/cache.rs", "fn get(&self, key: u64) -> Option<Block> {",
                      ["-        if let Some(b) = CACHE.lock().unwrap().get(&key).cloned() {",
                       "+        let found = CACHE.lock().unwrap().get(&key).cloned();",
                       "+        if let Some(b) = found {"]),
                 [CONCURRENCY], id="a-rust-lock-guards-scope"),
    # Rust: an atomic's memory ordering.
    pytest.param(hunk("src/engine/stats.rs", "fn record(&self) {",
                      ["-        self.count.fetch_add(1, Ordering::Relaxed);",
                       "+        self.count.fetch_add(1, Ordering::AcqRel);"]),
                 [CONCURRENCY], id="a-rust-memory-ordering"),
    # Rust: a stream's poll returns another state.
    pytest.param(hunk("src/server/sse.rs", "fn poll_next(self: Pin<&mut Self>) -> Poll<...> {",
                      ["-            None => Poll::Pending,",
                       "+            None => Poll::Ready(None),"]),
                 [CONCURRENCY], id="a-rust-poll-state"),
    # Rust: a probability's logarithm taken in another base.
    pytest.param(hunk("src/sampler.rs", "fn logprob(p: f32) -> f32 {",
                      ["-    p.log2()",
                       "+    p.ln()"]),
                 [NUMERICS], id="a-rust-log-base"),
    # Go: an attention scale computed from another length.
    pytest.param(hunk("model/attention.go", "func (a *Attention) Forward(ctx Context) Tensor {",
                      ["-\tscale := 1.0 / math.Sqrt(float64(a.headDim))",
                       "+\tscale := 1.0 / math.Sqrt(float64(a.headDim+a.ropeDim))"]),
                 [NUMERICS], id="a-go-attention-scale"),
    # A Go sampling default.
    pytest.param(hunk("api/defaults.go", "func DefaultOptions() Options {",
                      ["-\t\tTopP:        0.9,",
                       "+\t\tTopP:        0.95,"]),
                 [NUMERICS], id="a-go-sampling-default"),
    # A requirement pinned in a requirements folder's file of another name.
    pytest.param(unified("deps/gpu/cuda12.txt", "jax[cuda12]>=0.4.30\n", "jax[cuda12]>=0.5.0\n"),
                 [PRODUCTION], id="a-pin-in-a-requirements-folder"),
    # A compiled extension loaded on one platform only.
    pytest.param(hunk("mylib/ops/__init__.py", "def load():",
                      ["-    if torch.cuda.is_available():",
                       '+    if torch.cuda.is_available() and sys.platform.startswith("linux"):',
                       "         _load_cuda_ops()"]),
                 [PRODUCTION], id="an-extension-on-one-platform"),
    # The device bound before the process group, not passed to it.
    pytest.param(hunk("dist/setup.py", "def init(rank, world):",
                      ["+    torch.cuda.set_device(rank % torch.cuda.device_count())",
                       '     dist.init_process_group("nccl", rank=rank, world_size=world)']),
                 [CONCURRENCY], id="a-device-bound-before-the-group"),
    # A job launched standalone when no rendezvous endpoint is given.
    pytest.param(hunk("cli/launch.py", "def run(args):",
                      ["+    if not args.rdzv_endpoint:",
                       "+        args.standalone = True",
                       "     elastic_launch(config)(args)"]),
                 [CONCURRENCY, PRODUCTION], id="a-job-launched-standalone"),
    # A command-line option's default flipped, its add_argument call above the hunk.
    pytest.param(hunk("tools/convert.py", "def main():",
                      ['       "--use_cache",',
                       "       type=bool,",
                       "-      default=False,",
                       "+      default=True,",
                       '       help="Reuse converted shards",']),
                 [PRODUCTION], id="an-option-default-flipped"),
    # An XLA flag that pipelines a collective, in a launch script.
    pytest.param(unified("run/train.sh", 'export XLA_FLAGS="$XLA_FLAGS"\npython train.py \\\n'
                         "  --xla_tpu_enable_async_all_gather=false\n",
                         'export XLA_FLAGS="$XLA_FLAGS"\npython train.py \\\n'
                         "  --xla_tpu_enable_async_all_gather=true\n"),
                 [CONCURRENCY, PRODUCTION], id="an-async-all-gather-flag"),
]


@pytest.mark.parametrize(("diff", "classes"), ELEVENTH_ROUND_RISKY)
def test_what_the_tenth_held_out_set_showed(diff: str, classes: list[str]) -> None:
    assert risk_classes(classify(diff)) == classes


ELEVENTH_ROUND_HARMLESS = [
    # A typo fixed in a Go error message.
    pytest.param(hunk("server/routes.go", "func (s *Server) pull(w http.ResponseWriter) {",
                      ['-\t\treturn fmt.Errorf("model %s not foud: %w", name, err)',
                       '+\t\treturn fmt.Errorf("model %s not found: %w", name, err)']),
                 id="a-go-error-message-typo"),
    # A Rust comment naming a lock.
    pytest.param(hunk("src/engine/cache.rs", "fn evict(&self) {",
                      ["-        // takes the map's lock()",
                       "+        // takes the map's write lock()"]),
                 id="a-rust-comment-naming-a-lock"),
    # An option's help text re-worded, its default unchanged.
    pytest.param(hunk("tools/convert.py", "def main():",
                      ['       "--use_cache",',
                       "       default=False,",
                       '-      help="reuse shards",',
                       '+      help="Reuse converted shards",']),
                 id="an-option-help-re-worded"),
    # A README in a requirements folder.
    pytest.param(unified("requirements/README.txt", "Pins for CI.\n", "Pins for CI and docs.\n"),
                 id="a-readme-in-a-requirements-folder"),
]


@pytest.mark.parametrize("diff", ELEVENTH_ROUND_HARMLESS)
def test_what_the_tenth_held_out_set_showed_harmless_stays_harmless(diff: str) -> None:
    assert classify(diff) == []
