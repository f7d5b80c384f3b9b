"""Hostile patches (reliability rows G1, G2, G5): reviews.diff_policy refuses or routes each
one, and through the agent's own write tools and the host's commit and merge nothing changes
outside the worktree, nothing is written under .git, and no planted hook runs."""

from __future__ import annotations

import json
import os
import subprocess
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from agents.tools import ToolContext, ToolResult, tool_call, workspace
from infraops import gitops
from reviews.diff_policy import (
    MAX_DIFF_BYTES,
    MAX_FILES,
    Policy,
    Violation,
    check_diff,
    review_reasons,
)

AUTHOR = {"author_name": "InfraOps agent", "author_email": "agent@infraops.localhost"}
OUTSIDE = "@OUTSIDE@"  # replaced by the canary folder's absolute path in the end-to-end part

BASE_FILES = {
    "src/kernel.py": "def step(x):\n    return x + 1\n",
    "src/config.py": "BLOCK = 64\n",
    "docs/NOTES.md": "Notes.\n",
    "infraops.toml": '[[probe]]\nname = "unit"\ncommand = "pytest"\n',
}

# Everything editable: what refuses these patches is what makes them hostile, not the
# editable globs.
OPEN = Policy(editable=["**"], protected=["infraops.toml"], forbidden_patterns=[],
              max_diff_lines=100_000)


def new_file(path: str, text: str = "x = 1\n", *, mode: str = "100644",
             quoted: str | None = None) -> str:
    """A git-style diff creating ``path``; ``quoted``: the name as git quotes it."""
    a, b = (f'"a/{quoted}"', f'"b/{quoted}"') if quoted else (f"a/{path}", f"b/{path}")
    lines = text.splitlines(keepends=True)
    body = "".join(f"+{line}" for line in lines)
    if not text.endswith("\n"):
        body += "\n\\ No newline at end of file\n"
    return (f"diff --git {a} {b}\nnew file mode {mode}\n--- /dev/null\n+++ {b}\n"
            f"@@ -0,0 +1,{len(lines)} @@\n{body}")


def many_files(count: int, *, lines: int = 1, width: int = 10) -> str:
    row = "x" * width
    return "".join(new_file(f"src/gen/f{i}.py", f"{row}\n" * lines) for i in range(count))


BINARY_PATCH = """\
diff --git a/src/blob.bin b/src/blob.bin
new file mode 100644
index 0000000000000000000000000000000000000000..8352675d67aed6625ece79af41c27fdb4ee2e867
GIT binary patch
literal 3
KcmZQzWC8#H2LJ>B

literal 0
HcmV?d00001

"""

BINARY_DIFFER = """\
diff --git a/src/model.onnx b/src/model.onnx
new file mode 100644
index 0000000..4e056e6
Binary files /dev/null and b/src/model.onnx differ
"""

MODE_CHANGE = """\
diff --git a/src/config.py b/src/config.py
old mode 100644
new mode 100755
"""

GITLINK = """\
diff --git a/src/sub b/src/sub
new file mode 160000
index 0000000..d4a0637
--- /dev/null
+++ b/src/sub
@@ -0,0 +1 @@
+Subproject commit d4a06373955655d5cd166ad0ebfc78664ca61da8
"""

GIT_CONFIG_EDIT = """\
diff --git a/.git/config b/.git/config
--- a/.git/config
+++ b/.git/config
@@ -1 +1,3 @@
 [core]
+[core]
+\thooksPath = src
"""


@dataclass(frozen=True)
class Hostile:
    diff: str
    expected: str  # the reason a person reads (with its path), or for routed ones the note
    routed: bool = False


HOSTILE: dict[str, Hostile] = {
    "traversal": Hostile(new_file("../outside/evil.py"),
                         "../outside/evil.py: leaves the repository"),
    "traversal-inside-a-path": Hostile(new_file("src/../../outside/evil.py"),
                                       "src/../../outside/evil.py: leaves the repository"),
    "absolute-path": Hostile("--- /dev/null\n+++ @OUTSIDE@/evil.py\n@@ -0,0 +1 @@\n+x = 1\n",
                             "@OUTSIDE@/evil.py: leaves the repository"),
    "dot-git-hook": Hostile(new_file(".git/hooks/pre-commit",
                                     "#!/bin/sh\ntouch @OUTSIDE@/pwned\n"),
                            ".git/hooks/pre-commit: is inside .git"),
    "dot-git-config": Hostile(GIT_CONFIG_EDIT, ".git/config: is inside .git"),
    "dot-git-in-other-case": Hostile(new_file("src/.GIT/config", "[core]\n"),
                                     "src/.GIT/config: is inside .git"),
    "symlink-out": Hostile(new_file("src/leak", "@OUTSIDE@/secret.txt", mode="120000"),
                           "src/leak: symlinks may not be created or changed"),
    "symlink-through": Hostile(new_file("src/out", "../../outside", mode="120000")
                               + new_file("src/out/evil.py"),
                               "src/out: symlinks may not be created or changed"),
    # git reads modes with strtoul(..., 8): a zero-padded mode is still a symlink.
    "symlink-with-a-padded-mode": Hostile(new_file("src/alias", "kernel.py", mode="0120000"),
                                          "src/alias: symlinks may not be created or changed"),
    "gitmodules": Hostile(new_file(".gitmodules", '[submodule "x"]\n\tpath = x\n'
                                                  "\turl = ../outside\n"),
                          ".gitmodules: is protected (.gitmodules)"),
    "gitattributes": Hostile(new_file("src/.gitattributes", "* filter=evil\n"),
                             "src/.gitattributes: is protected (**/.gitattributes)"),
    "submodule-gitlink": Hostile(GITLINK,
                                 "src/sub: submodules (gitlinks) may not be added or changed"),
    "ci-github": Hostile(new_file(".github/workflows/ci.yml", "on: push\n"),
                         ".github/workflows/ci.yml: is protected (.github/**)"),
    "ci-gitlab": Hostile(new_file(".gitlab-ci.yml", "job: {script: [id]}\n"),
                         ".gitlab-ci.yml: is protected (.gitlab-ci.yml)"),
    # git quotes non-ASCII names; read unquoted they would dodge the .github/** glob.
    "ci-file-in-a-quoted-name": Hostile(
        new_file(".github/workflows/é.yml", "on: push\n",
                 quoted=".github/workflows/\\303\\251.yml"),
        ".github/workflows/é.yml: is protected (.github/**)"),
    "new-executable-file": Hostile(
        new_file("src/run.sh", "#!/bin/sh\nid\n", mode="100755"),
        "src/run.sh: would be a new executable file (mode 100755); mode changes are refused"),
    "executable-with-a-padded-mode": Hostile(
        new_file("src/run.sh", "#!/bin/sh\nid\n", mode="+0100775"),
        "src/run.sh: would be a new executable file (mode +0100775); mode changes are "
        "refused"),
    "mode-change-plus-x": Hostile(
        MODE_CHANGE,
        "src/config.py: changes its mode from 100644 to 100755; mode changes are refused"),
    "binary-git-patch": Hostile(BINARY_PATCH, "src/blob.bin: is a binary file: a person must "
                                              "review it", routed=True),
    "binary-files-differ": Hostile(BINARY_DIFFER, "src/model.onnx: is a binary file: a person "
                                                  "must review it", routed=True),
    "over-1-mib": Hostile(new_file("src/big.py", "x = 1  # padding padding padding\n" * 33_000),
                          f"exceed the cap of {MAX_DIFF_BYTES} bytes; not read further"),
    "over-200-files": Hostile(many_files(MAX_FILES + 1),
                              f"(diff): {MAX_FILES + 1} files exceed the cap of {MAX_FILES} "
                              "files; not read further"),
    "nul-in-path": Hostile(new_file("src/x\0y.py"),
                           "src/x\\x00y.py: contains the control character \\x00"),
    "escape-sequence-in-path": Hostile(new_file("src/\x1b[2Jok.py"),
                                       "src/\\x1b[2Jok.py: contains the control character "
                                       "\\x1b"),
    "tab-in-a-quoted-name": Hostile(new_file("src/a\tb.py", quoted="src/a\\tb.py"),
                                    "src/a\\x09b.py: contains the control character \\x09"),
    "case-collision-in-the-diff": Hostile(new_file("src/Notes.py") + new_file("src/notes.py"),
                                          "src/notes.py: differs only in case from "
                                          "src/Notes.py"),
    "case-collision-with-a-file": Hostile(new_file("src/Config.py"),
                                          "src/Config.py: differs only in case from "
                                          "src/config.py"),
    "case-collision-with-a-folder": Hostile(new_file("SRC/extra.py"),
                                            "SRC/extra.py: differs only in case from src"),
}


def reasons(violations: list[Violation]) -> list[str]:
    return [str(v) for v in violations]


def test_the_corpus_covers_every_kind_the_issue_names() -> None:
    kinds = ["traversal", "absolute", "dot-git", "symlink-through", "symlink-out", "gitmodules",
             "gitattributes", "ci-", "executable", "binary", "over-1-mib", "over-200-files",
             "nul", "case-collision"]

    assert len(HOSTILE) >= 14
    assert [kind for kind in kinds if not any(kind in name for name in HOSTILE)] == []


# --------------------------------------------------------------------------- the policy


@pytest.mark.parametrize("case", [n for n, h in HOSTILE.items() if not h.routed])
def test_a_hostile_patch_is_refused_with_a_reason_naming_what_is_wrong(case: str) -> None:
    hostile = HOSTILE[case]
    diff = hostile.diff.replace(OUTSIDE, "/srv/outside")

    found = reasons(check_diff(diff, OPEN, existing=BASE_FILES))

    expected = hostile.expected.replace(OUTSIDE, "/srv/outside")
    assert any(expected in reason for reason in found), found


@pytest.mark.parametrize("case", [n for n, h in HOSTILE.items() if h.routed])
def test_a_binary_patch_passes_the_policy_and_is_routed_to_a_person(case: str) -> None:
    hostile = HOSTILE[case]

    assert check_diff(hostile.diff, OPEN, existing=BASE_FILES) == []
    assert reasons(review_reasons(hostile.diff)) == [hostile.expected]


def test_a_binary_patch_still_has_its_path_checked() -> None:
    diff = BINARY_DIFFER.replace("src/model.onnx", ".github/model.onnx")

    assert reasons(check_diff(diff, OPEN)) == [".github/model.onnx: is protected (.github/**)"]


def test_a_text_diff_needs_no_review_of_its_own() -> None:
    assert review_reasons(new_file("src/extra.py")) == []


def test_editing_an_already_executable_file_is_not_a_mode_change() -> None:
    diff = ("diff --git a/src/run.sh b/src/run.sh\nindex 1111111..2222222 100755\n"
            "--- a/src/run.sh\n+++ b/src/run.sh\n@@ -1 +1 @@\n-echo a\n+echo b\n")

    assert check_diff(diff, OPEN) == []


def test_deleting_a_file_and_adding_it_in_another_case_is_a_rename_not_a_collision() -> None:
    deletion = ("diff --git a/src/config.py b/src/config.py\ndeleted file mode 100644\n"
                "--- a/src/config.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-BLOCK = 64\n")

    assert check_diff(deletion + new_file("src/Config.py"), OPEN, existing=BASE_FILES) == []


def test_modifying_a_file_of_a_repository_that_already_has_a_case_pair_is_allowed() -> None:
    existing = [*BASE_FILES, "src/Kernel.py"]
    diff = ("--- a/src/kernel.py\n+++ b/src/kernel.py\n@@ -1,2 +1,2 @@\n def step(x):\n"
            "-    return x + 1\n+    return x + 2\n")

    assert check_diff(diff, OPEN, existing=existing) == []


def test_a_boundary_can_set_its_own_caps() -> None:
    tight = Policy(editable=["**"], protected=[], forbidden_patterns=[], max_diff_lines=100,
                   max_diff_bytes=100, max_files=1)
    diff = new_file("src/a.py", "a = 1\n" * 20) + new_file("src/b.py")

    assert reasons(check_diff(diff, tight)) == [
        f"(diff): {len(diff)} bytes exceed the cap of 100 bytes; not read further",
        "(diff): 2 files exceed the cap of 1 files; not read further",
    ]


def test_a_huge_diff_is_refused_on_its_caps_before_it_is_parsed() -> None:
    # 10,000 files and over 50 MiB, every one outside the editable paths and full of a
    # forbidden pattern: parsed, it would give thousands of other violations.
    policy = Policy(editable=["docs/**"], protected=[], forbidden_patterns=["x"],
                    max_diff_lines=400)
    diff = many_files(10_000, lines=90, width=59)
    assert len(diff) > 50 * 2**20

    tracemalloc.start()
    try:
        violations = check_diff(diff, policy)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert reasons(violations) == [
        f"(diff): {len(diff)} bytes exceed the cap of {MAX_DIFF_BYTES} bytes; not read further",
        f"(diff): 10000 files exceed the cap of {MAX_FILES} files; not read further",
    ]
    # Bounded memory (row G2): the refusal copies, encodes or splits none of the 50 MiB (one
    # copy alone would be 50 MiB; bench/hostile_patches.py prints the peak and the time).
    assert peak < 8 * 2**20


def test_a_huge_non_ascii_diff_is_measured_in_characters_without_being_encoded() -> None:
    diff = new_file("src/é.py", "é\n" * (MAX_DIFF_BYTES // 2))

    assert reasons(check_diff(diff, OPEN)) == [
        f"(diff): {len(diff)} characters exceed the cap of {MAX_DIFF_BYTES} bytes; not read "
        "further"
    ]


def test_a_non_ascii_diff_under_the_cap_in_characters_is_measured_in_bytes() -> None:
    diff = new_file("src/é.py", "é\n" * (MAX_DIFF_BYTES // 4))

    assert len(diff) < MAX_DIFF_BYTES
    assert reasons(check_diff(diff, OPEN)) == [
        f"(diff): {len(diff.encode())} bytes exceed the cap of {MAX_DIFF_BYTES} bytes; not "
        "read further"
    ]


# --------------------------------------------------------------------------- end to end


@pytest.fixture
def ctx(tmp_path: Path, outside: Path) -> ToolContext:
    """A run's worktree (tmp_path/run-1) of a bare repository (tmp_path/repo.git), as
    agents.policies.llm sets them up, with the policy of OPEN."""
    seed = tmp_path / "seed"
    for name, text in BASE_FILES.items():
        (seed / name).parent.mkdir(parents=True, exist_ok=True)
        (seed / name).write_text(text)
    repo = tmp_path / "repo.git"
    base = gitops.repo_init_from_dir(seed, repo, branch="main", message="base")
    worktree = tmp_path / "run-1"
    gitops.worktree_add(repo, worktree, base, branch="infraops/run-1")
    return ToolContext(worktree=worktree, policy=OPEN, base_commit=base)


def snapshot(folder: Path) -> dict[str, tuple[int, int, int, str]]:
    """Every entry under ``folder`` (the worktree, its repository's git folder and the
    canary folder beside them): mtime, size, mode and link target."""
    found: dict[str, tuple[int, int, int, str]] = {}
    for where, dirs, files in os.walk(folder):
        for name in [*dirs, *files]:
            full = Path(where) / name
            info = full.lstat()
            target = os.readlink(full) if full.is_symlink() else ""
            found[full.relative_to(folder).as_posix()] = (info.st_mtime_ns, info.st_size,
                                                          info.st_mode, target)
    return found


def call(ctx: ToolContext, name: str, **arguments: str) -> ToolResult:
    return tool_call(ctx, name, json.dumps(arguments))


@pytest.mark.parametrize("case", list(HOSTILE))
def test_through_apply_diff_no_hostile_patch_changes_anything(
        ctx: ToolContext, tmp_path: Path, outside: Path, case: str) -> None:
    diff = HOSTILE[case].diff.replace(OUTSIDE, str(outside))
    before = snapshot(tmp_path)

    result = call(ctx, "apply_diff", diff=diff)

    assert not result.ok
    # Binary patches are the policy's to route but the tool's to refuse: git apply would
    # write bytes nobody can read. The over-1-MiB diff is stopped by the argument cap.
    if case != "over-1-mib":
        assert result.refusal is not None, result.content
    assert snapshot(tmp_path) == before
    assert not list(tmp_path.rglob("pwned"))
    assert not list(tmp_path.rglob("evil.py"))


@pytest.mark.parametrize(("path", "reason"), [
    ("../outside/evil.py", "leaves the repository"),
    (f"{OUTSIDE}/evil.py", "leaves the repository"),
    (".git/hooks/pre-commit", "is inside .git"),
    (".git/config", "is inside .git"),
    ("src/.GIT/config", "is inside .git"),
    (".gitmodules", "is protected (.gitmodules)"),
    ("src/.gitattributes", "is protected (**/.gitattributes)"),
    (".github/workflows/ci.yml", "is protected (.github/**)"),
    ("src/x\0y.py", "contains the control character \\x00"),
    ("src/\x1b[2Jok.py", "contains the control character \\x1b"),
    ("src/Config.py", "differs only in case from src/config.py"),
    ("SRC/extra.py", "differs only in case from src"),
])
def test_through_edit_file_no_hostile_path_changes_anything(
        ctx: ToolContext, tmp_path: Path, outside: Path, path: str, reason: str) -> None:
    before = snapshot(tmp_path)

    result = call(ctx, "edit_file", path=path.replace(OUTSIDE, str(outside)), old_text="",
                  new_text="#!/bin/sh\ntouch pwned\n")

    assert result.refusal is not None and reason in result.refusal, result.content
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("tool", ["apply_diff", "edit_file"])
def test_a_write_through_a_symlink_already_in_the_worktree_is_refused(
        ctx: ToolContext, tmp_path: Path, outside: Path, tool: str) -> None:
    (ctx.worktree / "src" / "out").symlink_to(outside)
    before = snapshot(tmp_path)

    result = (call(ctx, "apply_diff", diff=new_file("src/out/evil.py")) if tool == "apply_diff"
              else call(ctx, "edit_file", path="src/out/evil.py", old_text="", new_text="x\n"))

    assert result.refusal is not None and "symlink" in result.refusal
    assert snapshot(tmp_path) == before
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]


def test_a_case_collision_hidden_from_the_diff_headers_is_undone(ctx: ToolContext) -> None:
    # check_diff reads 'x/src/Config.py' (no collision); git apply -p1 writes src/Config.py.
    diff = "--- /dev/null\n+++ x/src/Config.py\n@@ -0,0 +1 @@\n+x = 1\n"

    result = call(ctx, "apply_diff", diff=diff)

    assert result.refusal == ("src/Config.py: differs only in case from src/config.py; on a "
                              "case-insensitive checkout they are one file")
    assert not (ctx.worktree / "src" / "Config.py").exists()


@pytest.mark.parametrize(("write", "reason"), [
    (lambda full: full.symlink_to("kernel.py"), "symlinks may not be created or changed"),
    (lambda full: (full.write_text("#!/bin/sh\n"), full.chmod(0o755)), "would be executable"),
    (lambda full: full.write_text("x = 1\n"), "differs only in case from src/config.py"),
])
def test_what_git_wrote_past_the_checks_is_refused_and_undone(
        ctx: ToolContext, tmp_path: Path, write: Callable[[Path], object], reason: str) -> None:
    # The checks before writing read the diff as unidiff does; git may read it otherwise.
    # This stands in for such a difference: the write itself makes the forbidden thing.
    root = ctx.worktree.resolve()
    full = root / "src" / "Config.py"
    before = snapshot(ctx.worktree)

    with (pytest.raises(workspace.Refused) as refused,
          workspace._reverted_unless_safe(root, ["src/Config.py"])):
        write(full)

    assert any(reason in str(v) for v in refused.value.violations)
    assert not full.exists() and not full.is_symlink()
    assert {k: v for k, v in snapshot(ctx.worktree).items() if k != "src"} == {
        k: v for k, v in before.items() if k != "src"}


# --------------------------------------------------------------------------- the commit path


PLANTED = {
    "symlink-out": ("src/leak", "src/leak: symlinks may not be created or changed"),
    "symlink-in": ("src/alias", "src/alias: symlinks may not be created or changed"),
    "executable": ("src/run.sh", "src/run.sh: would be a new executable file (mode 100755)"),
    "nested-repository": ("src/sub", "src/sub: submodules (gitlinks) may not be added"),
    "ci-file-in-a-quoted-name": (".github/workflows/é.yml",
                                 ".github/workflows/é.yml: is protected (.github/**)"),
    "control-character": ("src/a\tb.py", "src/a\\x09b.py: contains the control character"),
    "case-collision": ("src/Config.py", "src/Config.py: differs only in case from "
                                        "src/config.py"),
}


def plant(worktree: Path, case: str, outside: Path) -> None:
    """What no agent tool writes, written straight into the worktree (as a bug or an
    escaped probe would), for `git add --all` to pick up."""
    full = worktree / PLANTED[case][0]
    if case == "symlink-out":
        full.symlink_to(outside / "secret.txt")
    elif case == "symlink-in":
        full.symlink_to("kernel.py")
    elif case == "executable":
        full.write_text("#!/bin/sh\nid\n")
        full.chmod(0o755)
    elif case == "nested-repository":
        full.mkdir()
        subprocess.run(["git", "init", "-q", str(full)], check=True)
        (full / "s.txt").write_text("s\n")
        subprocess.run(["git", "-C", str(full), "-c", "user.name=x", "-c", "user.email=x@x",
                        "commit", "-qm", "s", "--allow-empty"], check=True)
    else:
        full.parent.mkdir(parents=True, exist_ok=True)
        full.write_text("x = 1\n")


@pytest.mark.parametrize("case", list(PLANTED))
def test_a_commit_with_planted_content_is_refused_by_the_check_on_its_diff(
        ctx: ToolContext, outside: Path, case: str) -> None:
    """The check agents.policies.shared runs on base..head after commit_all, before an experiment
    (and so before the commit can be submitted)."""
    plant(ctx.worktree, case, outside)
    repo = ctx.worktree.parent / "repo.git"

    head = gitops.commit_all(ctx.worktree, "agent experiment", **AUTHOR)
    assert head is not None
    diff = gitops.diff(repo, ctx.base_commit, head)
    found = reasons(check_diff(diff, OPEN, existing=gitops.list_files(repo, ctx.base_commit)))

    assert any(PLANTED[case][1] in reason for reason in found), (diff, found)


def test_a_committed_binary_file_passes_the_policy_and_is_routed(ctx: ToolContext) -> None:
    (ctx.worktree / "src" / "weights.bin").write_bytes(b"\0\1\2binary")
    repo = ctx.worktree.parent / "repo.git"

    head = gitops.commit_all(ctx.worktree, "agent experiment", **AUTHOR)
    assert head is not None
    diff = gitops.diff(repo, ctx.base_commit, head)

    assert check_diff(diff, OPEN) == []
    assert reasons(review_reasons(diff)) == [
        "src/weights.bin: is a binary file: a person must review it"]


# --------------------------------------------------------------------------- hooks (G5)


def _hook(path: Path, canary: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\necho {path.name} >> '{canary}'\n")
    path.chmod(0o755)


def test_hooks_planted_for_an_agent_change_never_run_on_the_host(
        ctx: ToolContext, tmp_path: Path, outside: Path) -> None:
    """tests/infraops/test_gitops.py covers hooks in the repository's own hooks folder;
    this covers what an agent change could plant: hooks through its tools (refused), and,
    past them, a hooks folder in the worktree named by core.hooksPath in the repository's
    config and in the worktree's own config, with fsmonitor pointed at a hook too."""
    canary = outside / "hook-ran"
    hook_body = f"#!/bin/sh\necho ran >> '{canary}'\n"
    by_tools = [
        call(ctx, "edit_file", path=".git/hooks/pre-commit", old_text="", new_text=hook_body),
        call(ctx, "apply_diff", diff=new_file(".git/hooks/post-commit", hook_body)),
        call(ctx, "apply_diff", diff=new_file("src/hooks/pre-commit", hook_body,
                                              mode="100755")),
        call(ctx, "apply_diff", diff=GIT_CONFIG_EDIT),
    ]
    assert [r.refusal is not None for r in by_tools] == [True] * 4
    assert call(ctx, "edit_file", path="src/x.py", old_text="", new_text="x = 2\n").ok

    repo = tmp_path / "repo.git"
    other = tmp_path / "other"
    gitops.worktree_add(repo, other, ctx.base_commit)
    (other / "docs" / "more.md").write_text("more\n")
    tip = gitops.commit_all(other, "meanwhile on main", **AUTHOR)
    assert tip is not None
    gitops.git(repo, "update-ref", "refs/heads/main", tip)
    hooks = ctx.worktree / "src" / "hooks"
    for name in ("pre-commit", "commit-msg", "post-commit", "reference-transaction",
                 "post-merge", "fsmonitor"):
        _hook(hooks / name, canary)
    gitops.git(repo, "config", "core.hooksPath", str(hooks))
    gitops.git(repo, "config", "core.fsmonitor", str(hooks / "fsmonitor"))
    gitops.git(repo, "config", "extensions.worktreeConfig", "true")
    # With worktreeConfig on, the bare repository's core.bare would apply to the worktree.
    (repo / "worktrees" / "run-1" / "config.worktree").write_text(
        f"[core]\n\tbare = false\n\thooksPath = {hooks}\n")

    head = gitops.commit_all(ctx.worktree, "agent experiment", **AUTHOR)
    assert head is not None
    merged = gitops.merge(repo, branch="main", commit=head, expected_base=tip, message="merge",
                          **AUTHOR)

    assert gitops.list_files(repo, merged).count("src/x.py") == 1
    assert not canary.exists()
    # Control: plain git in the same worktree runs the planted hooks, so the check can fail.
    subprocess.run(["git", "-C", str(ctx.worktree), "-c", "user.name=x", "-c",
                    "user.email=x@x", "commit", "-q", "--allow-empty", "-m", "control"],
                   check=True, capture_output=True)
    assert canary.exists()


def test_a_clean_filter_planted_in_the_repository_config_never_runs_on_commit(
        ctx: ToolContext, tmp_path: Path, outside: Path) -> None:
    """Past the tools (the policy refuses .gitattributes, and .git is out of their reach):
    a filter driver in the config names a program `git add --all` runs on the host."""
    canary = outside / "filter-ran"
    repo = tmp_path / "repo.git"
    gitops.git(repo, "config", "filter.evil.clean", f"sh -c 'touch {canary}; cat'")
    (ctx.worktree / ".gitattributes").write_text("* filter=evil\n")
    (ctx.worktree / "src" / "x.py").write_text("x = 2\n")

    with pytest.raises(gitops.GitError):
        gitops.commit_all(ctx.worktree, "agent experiment", **AUTHOR)

    assert not canary.exists()
