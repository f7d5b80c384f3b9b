"""infraops.gitops against real git repositories in temporary folders."""

from __future__ import annotations

import ast
import http.server
import os
import pickle
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from infraops import gitops
from infraops.gitops import GitError, MergeConflict, RefMoved

AUTHOR = {"author_name": "Agent Smith", "author_email": "agent@example.test"}


# --------------------------------------------------------------------------- helpers


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _origin(tmp_path: Path, files: dict[str, str] | None = None) -> Path:
    """A bare repository whose main branch holds ``files``."""
    src = tmp_path / "src"
    _write(src, files or {"README.md": "hello\n", "pkg/code.py": "x = 1\n"})
    repo = tmp_path / "origin.git"
    gitops.repo_init_from_dir(src, repo, branch="main", message="initial")
    return repo


def _commit_on(repo: Path, tmp_path: Path, base: str, files: dict[str, str], name: str) -> str:
    """Commit ``files`` on top of ``base`` in a throwaway worktree; return the sha."""
    tree = tmp_path / f"wt-{name}"
    gitops.worktree_add(repo, tree, base)
    _write(tree, files)
    sha = gitops.commit_all(tree, f"change {name}", **AUTHOR)
    gitops.worktree_remove(repo, tree)
    assert sha is not None
    return sha


def _plant_hooks(hooks: Path, marker: Path) -> None:
    hooks.mkdir(parents=True, exist_ok=True)
    names = [
        "pre-commit",
        "commit-msg",
        "post-commit",
        "post-checkout",
        "post-merge",
        "reference-transaction",
        "pre-push",
        "pre-receive",
        "update",
        "post-receive",
    ]
    for name in names:
        hook = hooks / name
        hook.write_text(f"#!/bin/sh\necho {name} >> '{marker}'\n")
        hook.chmod(0o755)


def _parents(repo: Path, sha: str) -> list[str]:
    return gitops.git(repo, "rev-list", "--parents", "-n", "1", sha).split()[1:]


@pytest.fixture
def silent_git_server() -> Iterator[int]:
    """A TCP port that accepts git:// connections and never answers."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        yield server.getsockname()[1]


# --------------------------------------------------------------------------- repositories


def test_init_from_dir_commits_the_folders_files_without_touching_the_folder(
    tmp_path: Path,
) -> None:
    src = tmp_path / "example"
    _write(src, {"a.txt": "A\n", "sub/b.txt": "B\n"})
    before = sorted(p.relative_to(src) for p in src.rglob("*"))

    sha = gitops.repo_init_from_dir(src, tmp_path / "ex.git", branch="trunk", message="import")

    assert gitops.rev_parse(tmp_path / "ex.git", "trunk") == sha
    assert gitops.list_files(tmp_path / "ex.git", sha) == ["a.txt", "sub/b.txt"]
    assert (
        gitops.git(tmp_path / "ex.git", "log", "-1", "--format=%s|%cn", sha) == "import|InfraOps\n"
    )
    assert sorted(p.relative_to(src) for p in src.rglob("*")) == before
    assert not (tmp_path / "ex.git" / "infraops-import.index").exists()


def test_init_from_dir_refuses_a_destination_that_is_not_empty(tmp_path: Path) -> None:
    _write(tmp_path / "src", {"a.txt": "A\n"})
    _write(tmp_path / "dest", {"keep.txt": "mine\n"})

    with pytest.raises(GitError, match="not empty"):
        gitops.repo_init_from_dir(tmp_path / "src", tmp_path / "dest", branch="main", message="m")


def test_cloning_a_missing_path_raises_a_git_error_naming_the_url(tmp_path: Path) -> None:
    missing = str(tmp_path / "nowhere.git")

    with pytest.raises(GitError) as caught:
        gitops.repo_clone_bare(missing, tmp_path / "clone.git")

    message = caught.value.args[0]
    assert message.startswith(f"could not clone {missing!r}")
    assert "git clone" in message
    assert "does not exist" in message
    assert not (tmp_path / "clone.git").exists()


def test_a_clone_from_a_server_that_never_answers_is_killed_at_the_timeout(
    tmp_path: Path, silent_git_server: int
) -> None:
    # The error names the timeout that killed it; a clone left waiting would hang until the
    # suite's own timeout fails the test.
    with pytest.raises(GitError, match=r"timed out after 1 s"):
        gitops.repo_clone_bare(
            f"git://127.0.0.1:{silent_git_server}/r.git", tmp_path / "c.git", timeout=1
        )

    assert not (tmp_path / "c.git").exists()


def test_a_clone_holds_every_branch_and_fetch_brings_new_upstream_work_to_remote_refs(
    tmp_path: Path,
) -> None:
    origin = _origin(tmp_path)
    clone = tmp_path / "clone.git"
    gitops.repo_clone_bare(str(origin), clone)
    assert gitops.rev_parse(clone, "main") == gitops.rev_parse(origin, "main")

    upstream = _commit_on(origin, tmp_path, "main", {"new.txt": "n\n"}, "up")
    gitops.git(origin, "update-ref", "refs/heads/main", upstream)
    gitops.repo_fetch(clone)

    assert gitops.rev_parse(clone, "refs/remotes/origin/main") == upstream
    assert gitops.rev_parse(clone, "main") != upstream


def test_rev_parse_of_an_unknown_revision_says_unknown_revision(tmp_path: Path) -> None:
    origin = _origin(tmp_path)

    assert len(gitops.rev_parse(origin, "main")) == 40
    with pytest.raises(GitError, match="unknown revision 'nope'"):
        gitops.rev_parse(origin, "nope")


def test_a_revision_that_looks_like_an_option_is_refused(tmp_path: Path) -> None:
    origin = _origin(tmp_path)

    with pytest.raises(GitError, match="not a usable revision"):
        gitops.rev_parse(origin, "--output=/tmp/x")


def test_branch_exists_tells_present_from_absent_branches(tmp_path: Path) -> None:
    origin = _origin(tmp_path)

    assert gitops.branch_exists(origin, "main")
    assert not gitops.branch_exists(origin, "feature")


def test_read_file_returns_exact_bytes_and_none_for_absent_paths_and_folders(
    tmp_path: Path,
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "blob.bin").write_bytes(b"\x00\xff\nlast line without newline")
    repo = tmp_path / "r.git"
    sha = gitops.repo_init_from_dir(src, repo, branch="main", message="m")
    _write(src, {"dir/x.txt": "x"})

    assert gitops.read_file(repo, sha, "blob.bin") == b"\x00\xff\nlast line without newline"
    assert gitops.read_file(repo, "main", "absent.txt") is None
    assert gitops.read_file(repo, "main", "dir") is None
    with pytest.raises(GitError, match="unknown revision"):
        gitops.read_file(repo, "0" * 40, "blob.bin")


def test_a_folder_that_is_not_a_repository_is_not_taken_for_the_enclosing_one(
    tmp_path: Path,
) -> None:
    origin = _origin(tmp_path)
    tree = tmp_path / "wt"
    gitops.worktree_add(origin, tree, "main")
    plain = tree / "pkg"

    with pytest.raises(GitError, match="not a git repository"):
        gitops.git(plain, "status")


def test_a_git_error_names_the_command_the_folder_and_gits_first_line(tmp_path: Path) -> None:
    origin = _origin(tmp_path)

    with pytest.raises(GitError) as caught:
        gitops.git(origin, "cat-file", "-p", "main:absent.txt")

    message = caught.value.args[0]
    assert "`git cat-file -p main:absent.txt`" in message
    assert str(origin.resolve()) in message
    assert "exit status 128" in message
    assert "absent.txt" in message.split(":", 1)[1]


# --------------------------------------------------------------------------- worktrees


def test_a_worktree_commit_shows_in_diff_and_changed_paths(tmp_path: Path) -> None:
    origin = _origin(tmp_path)
    base = gitops.rev_parse(origin, "main")
    tree = tmp_path / "wt"
    gitops.worktree_add(origin, tree, base, branch="run-1")
    _write(tree, {"pkg/code.py": "x = 2\n", "pkg/new.py": "y = 3\n"})
    (tree / "README.md").unlink()

    head = gitops.commit_all(tree, "tweak x", **AUTHOR)

    assert head is not None
    assert gitops.rev_parse(origin, "run-1") == head
    assert gitops.changed_paths(origin, base, head) == ["README.md", "pkg/code.py", "pkg/new.py"]
    text = gitops.diff(origin, base, head, context=0)
    assert "--- a/pkg/code.py\n+++ b/pkg/code.py\n@@ -1 +1 @@\n-x = 1\n+x = 2\n" in text
    assert "+++ /dev/null" in text
    assert "\x1b[" not in text
    log = gitops.git(origin, "log", "-1", "--format=%an <%ae>|%cn <%ce>|%s", head)
    assert log == "Agent Smith <agent@example.test>|InfraOps <infraops@localhost>|tweak x\n"


def test_commit_all_returns_none_when_nothing_changed(tmp_path: Path) -> None:
    origin = _origin(tmp_path)
    tree = tmp_path / "wt"
    gitops.worktree_add(origin, tree, "main")

    assert gitops.commit_all(tree, "nothing", **AUTHOR) is None
    assert gitops.rev_parse(tree, "HEAD") == gitops.rev_parse(origin, "main")


def test_commit_all_keeps_message_lines_that_start_with_a_hash(tmp_path: Path) -> None:
    origin = _origin(tmp_path)
    tree = tmp_path / "wt"
    gitops.worktree_add(origin, tree, "main")
    _write(tree, {"a.txt": "a\n"})

    sha = gitops.commit_all(tree, "Fix cache\n\n#42 was the cause\n", **AUTHOR)

    assert sha is not None
    assert (
        gitops.git(origin, "log", "-1", "--format=%B", sha) == "Fix cache\n\n#42 was the cause\n\n"
    )


def test_tree_export_writes_the_commits_files_and_leaves_no_trace_in_the_repository(
    tmp_path: Path,
) -> None:
    origin = _origin(tmp_path)
    changed = _commit_on(origin, tmp_path, "main", {"pkg/code.py": "x = 2\n", "run.sh": "true\n"},
                         "second")
    tree = tmp_path / "work" / "candidate"
    refs_before = gitops.git(origin, "for-each-ref")
    before = sorted(p.relative_to(origin) for p in origin.rglob("*") if "objects" not in p.parts)

    gitops.tree_export(origin, changed, tree)

    assert sorted(p.relative_to(tree).as_posix() for p in tree.rglob("*")) == [
        "README.md", "pkg", "pkg/code.py", "run.sh"]
    assert (tree / "pkg" / "code.py").read_text() == "x = 2\n"
    assert list(tree.parent.iterdir()) == [tree]  # its index is gone
    assert gitops.git(origin, "for-each-ref") == refs_before
    assert gitops._linked_worktrees(origin) == set()
    after = sorted(p.relative_to(origin) for p in origin.rglob("*") if "objects" not in p.parts)
    assert after == before


def test_tree_export_keeps_symlinks_and_the_executable_bit(tmp_path: Path) -> None:
    src = tmp_path / "src"
    _write(src, {"tool.sh": "#!/bin/sh\n"})
    (src / "tool.sh").chmod(0o755)
    (src / "link").symlink_to("tool.sh")
    origin = tmp_path / "origin.git"
    gitops.repo_init_from_dir(src, origin, branch="main", message="initial")

    gitops.tree_export(origin, "main", tmp_path / "tree")

    assert os.readlink(tmp_path / "tree" / "link") == "tool.sh"
    assert os.access(tmp_path / "tree" / "tool.sh", os.X_OK)


def test_tree_export_of_an_unknown_commit_fails_in_words_and_cleans_its_index(
    tmp_path: Path,
) -> None:
    origin = _origin(tmp_path)
    with pytest.raises(GitError, match=r"failed to unpack tree object 0{40}"):
        gitops.tree_export(origin, "0" * 40, tmp_path / "work" / "baseline")
    assert [p.name for p in (tmp_path / "work").iterdir()] == ["baseline"]


def test_worktree_add_with_an_existing_branch_name_is_refused(tmp_path: Path) -> None:
    origin = _origin(tmp_path)

    with pytest.raises(GitError, match="already exists"):
        gitops.worktree_add(origin, tmp_path / "wt", "main", branch="main")


def test_worktree_remove_deletes_a_dirty_worktree_and_tolerates_one_already_gone(
    tmp_path: Path,
) -> None:
    origin = _origin(tmp_path)
    tree = tmp_path / "wt"
    gitops.worktree_add(origin, tree, "main")
    _write(tree, {"README.md": "edited\n", "untracked.txt": "u\n"})

    gitops.worktree_remove(origin, tree)
    gitops.worktree_remove(origin, tree)

    assert not tree.exists()
    assert str(tree) not in gitops.git(origin, "worktree", "list")


def test_worktree_remove_refuses_a_folder_that_is_not_its_worktree(tmp_path: Path) -> None:
    origin = _origin(tmp_path)
    precious = tmp_path / "precious"
    _write(precious, {"data.txt": "keep\n"})

    with pytest.raises(GitError, match="refusing to delete"):
        gitops.worktree_remove(origin, precious)

    assert (precious / "data.txt").read_text() == "keep\n"


# --------------------------------------------------------------------------- merge


def test_merge_fast_forwards_when_the_branch_has_not_moved(tmp_path: Path) -> None:
    origin = _origin(tmp_path)
    base = gitops.rev_parse(origin, "main")
    change = _commit_on(origin, tmp_path, base, {"a.txt": "a\n"}, "a")

    tip = gitops.merge(
        origin, branch="main", commit=change, expected_base=base, message="m", **AUTHOR
    )

    assert tip == change
    assert gitops.rev_parse(origin, "main") == change


def test_merge_of_diverged_work_makes_a_two_parent_commit_with_both_changes(
    tmp_path: Path,
) -> None:
    origin = _origin(tmp_path)
    base = gitops.rev_parse(origin, "main")
    theirs = _commit_on(origin, tmp_path, base, {"a.txt": "a\n"}, "a")
    ours = _commit_on(origin, tmp_path, base, {"b.txt": "b\n"}, "b")
    gitops.git(origin, "update-ref", "refs/heads/main", ours)

    tip = gitops.merge(
        origin, branch="main", commit=theirs, expected_base=None, message="merge a", **AUTHOR
    )

    assert _parents(origin, tip) == [ours, theirs]
    assert gitops.rev_parse(origin, "main") == tip
    assert gitops.read_file(origin, tip, "a.txt") == b"a\n"
    assert gitops.read_file(origin, tip, "b.txt") == b"b\n"
    assert (
        gitops.git(origin, "log", "-1", "--format=%s|%an|%cn", tip)
        == "merge a|Agent Smith|InfraOps\n"
    )


def test_merging_an_already_merged_commit_leaves_the_branch_alone(tmp_path: Path) -> None:
    origin = _origin(tmp_path)
    old = gitops.rev_parse(origin, "main")
    tip = _commit_on(origin, tmp_path, old, {"a.txt": "a\n"}, "a")
    gitops.git(origin, "update-ref", "refs/heads/main", tip)

    assert (
        gitops.merge(origin, branch="main", commit=old, expected_base=tip, message="m", **AUTHOR)
        == tip
    )
    assert gitops.rev_parse(origin, "main") == tip


def test_a_conflicting_merge_names_the_file_and_leaves_the_branch_unchanged(
    tmp_path: Path,
) -> None:
    origin = _origin(tmp_path)
    base = gitops.rev_parse(origin, "main")
    theirs = _commit_on(origin, tmp_path, base, {"pkg/code.py": "x = 'theirs'\n"}, "t")
    ours = _commit_on(origin, tmp_path, base, {"pkg/code.py": "x = 'ours'\n"}, "o")
    gitops.git(origin, "update-ref", "refs/heads/main", ours)

    with pytest.raises(MergeConflict) as caught:
        gitops.merge(
            origin, branch="main", commit=theirs, expected_base=ours, message="m", **AUTHOR
        )

    assert caught.value.paths == ["pkg/code.py"]
    assert "git merge-tree --write-tree" in caught.value.args[0]
    assert "pkg/code.py" in caught.value.args[0]
    assert gitops.rev_parse(origin, "main") == ours


def test_a_merge_conflict_keeps_its_paths_through_pickling() -> None:
    error = MergeConflict("conflicts in a.txt", ["a.txt"])

    copy = pickle.loads(pickle.dumps(error))

    assert (copy.args[0], copy.paths) == ("conflicts in a.txt", ["a.txt"])


def test_merge_raises_ref_moved_when_expected_base_is_stale(tmp_path: Path) -> None:
    origin = _origin(tmp_path)
    stale = gitops.rev_parse(origin, "main")
    moved = _commit_on(origin, tmp_path, stale, {"a.txt": "a\n"}, "a")
    gitops.git(origin, "update-ref", "refs/heads/main", moved)
    change = _commit_on(origin, tmp_path, stale, {"b.txt": "b\n"}, "b")

    with pytest.raises(RefMoved, match="expected base"):
        gitops.merge(
            origin, branch="main", commit=change, expected_base=stale, message="m", **AUTHOR
        )

    assert gitops.rev_parse(origin, "main") == moved


def test_the_branch_update_is_a_compare_and_swap(tmp_path: Path) -> None:
    origin = _origin(tmp_path)
    read = gitops.rev_parse(origin, "main")
    moved = _commit_on(origin, tmp_path, read, {"a.txt": "a\n"}, "a")
    mine = _commit_on(origin, tmp_path, read, {"b.txt": "b\n"}, "b")
    gitops.git(origin, "update-ref", "refs/heads/main", moved)

    with pytest.raises(RefMoved, match="moved from"):
        gitops._compare_and_swap(origin, branch="main", new=mine, old=read)

    assert gitops.rev_parse(origin, "main") == moved


def test_merge_into_a_missing_branch_is_a_clear_error(tmp_path: Path) -> None:
    origin = _origin(tmp_path)

    with pytest.raises(GitError, match="branch 'release' does not exist"):
        gitops.merge(
            origin, branch="release", commit="main", expected_base=None, message="m", **AUTHOR
        )


def test_upstream_work_fetched_into_a_clone_merges_into_its_branch(tmp_path: Path) -> None:
    origin = _origin(tmp_path)
    clone = tmp_path / "clone.git"
    gitops.repo_clone_bare(str(origin), clone)
    upstream = _commit_on(origin, tmp_path, "main", {"up.txt": "u\n"}, "up")
    gitops.git(origin, "update-ref", "refs/heads/main", upstream)
    gitops.repo_fetch(clone)

    tip = gitops.merge(
        clone, branch="main", commit="origin/main", expected_base=None, message="m", **AUTHOR
    )

    assert tip == upstream


# --------------------------------------------------------------------------- hooks and push


def test_planted_hooks_never_run_during_commit_merge_or_push(tmp_path: Path) -> None:
    origin = _origin(tmp_path)
    remote = tmp_path / "remote.git"
    gitops.repo_clone_bare(str(origin), remote)
    marker = tmp_path / "hook-ran"
    _plant_hooks(origin / "hooks", marker)
    _plant_hooks(remote / "hooks", marker)
    base = gitops.rev_parse(origin, "main")

    tree = tmp_path / "wt"
    gitops.worktree_add(origin, tree, base, branch="run-1")
    _write(tree, {"a.txt": "a\n"})
    change = gitops.commit_all(tree, "agent change", **AUTHOR)
    assert change is not None
    ours = _commit_on(origin, tmp_path, base, {"b.txt": "b\n"}, "b")
    gitops.git(origin, "update-ref", "refs/heads/main", ours)
    gitops.merge(origin, branch="main", commit=change, expected_base=ours, message="m", **AUTHOR)
    gitops.push(origin, str(remote), "main")
    gitops.worktree_remove(origin, tree)

    assert not marker.exists()
    # Control: the same hooks do run under plain git, so the assertion above can fail.
    subprocess.run(
        ["git", "-C", str(origin), "update-ref", "refs/heads/control", base],
        check=True,
        env={**os.environ, "GIT_TERMINAL_PROMPT": "0"},
    )
    assert "reference-transaction" in marker.read_text()


def test_push_to_a_bare_remote_moves_its_branch(tmp_path: Path) -> None:
    origin = _origin(tmp_path)
    remote = tmp_path / "remote.git"
    gitops.repo_clone_bare(str(origin), remote)
    change = _commit_on(origin, tmp_path, "main", {"a.txt": "a\n"}, "a")
    gitops.git(origin, "update-ref", "refs/heads/main", change)

    gitops.push(origin, str(remote), "main")

    assert gitops.rev_parse(remote, "main") == change


def test_push_to_a_configured_remote_name_uses_its_url(tmp_path: Path) -> None:
    origin = _origin(tmp_path)
    clone = tmp_path / "clone.git"
    gitops.repo_clone_bare(str(origin), clone)
    change = _commit_on(clone, tmp_path, "main", {"a.txt": "a\n"}, "a")
    gitops.git(clone, "update-ref", "refs/heads/main", change)

    gitops.push(clone, "origin", "main")

    assert gitops.rev_parse(origin, "main") == change


@pytest.mark.parametrize(
    ("url", "local"),
    [
        ("/srv/repo.git", True),
        ("relative/repo", True),
        ("file:///srv/repo.git", True),
        ("./a:b", True),
        ("git@example.com:team/repo.git", False),
        ("ssh://example.com/repo.git", False),
        ("https://example.com/repo.git", False),
    ],
)
def test_local_urls_are_told_from_remote_ones_like_git_does(url: str, local: bool) -> None:
    assert gitops._is_local_url(url) is local


def _diverged(tmp_path: Path, our_branch: str) -> tuple[Path, Path, str, str]:
    """(origin, remote, theirs, ours): the remote's main moved to `theirs`, and `ours`, made
    on the old main, is the origin's `our_branch`."""
    origin = _origin(tmp_path)
    remote = tmp_path / "remote.git"
    gitops.repo_clone_bare(str(origin), remote)
    theirs = _commit_on(remote, tmp_path, "main", {"r.txt": "r\n"}, "r")
    gitops.git(remote, "update-ref", "refs/heads/main", theirs)
    ours = _commit_on(origin, tmp_path, "main", {"o.txt": "o\n"}, "o")
    gitops.git(origin, "update-ref", f"refs/heads/{our_branch}", ours)
    return origin, remote, theirs, ours


def test_a_push_that_is_not_a_fast_forward_is_rejected(tmp_path: Path) -> None:
    origin, remote, theirs, _ = _diverged(tmp_path, "main")

    with pytest.raises(GitError, match="git push") as caught:
        gitops.push(origin, str(remote), "main")

    assert "rejected" in caught.value.args[0]
    assert gitops.rev_parse(remote, "main") == theirs


def test_a_branch_named_like_a_force_cannot_overwrite_the_remote(tmp_path: Path) -> None:
    origin, remote, theirs, ours = _diverged(tmp_path, "+main")

    gitops.push(origin, str(remote), "+main")  # a branch of that name, never "force main"
    with pytest.raises(GitError, match="not a valid branch name"):
        gitops.push(origin, str(remote), "--force")

    assert gitops.rev_parse(remote, "main") == theirs
    assert gitops.rev_parse(remote, "+main") == ours


# Arguments that force or delete on a remote, or rewrite its refs wholesale (reliability row G4).
# (`fetch --prune` is not one: it prunes only the clone's own refs/remotes/.)
FORCING = ("--force", "--force-with-lease", "--force-if-includes", "--mirror", "--delete")
PRODUCT_CODE = ("infraops", "reviews", "agents")


def _string_literals(path: Path) -> Iterator[tuple[int, str]]:
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.lineno, node.value
        elif isinstance(node, ast.JoinedStr) and node.values and isinstance(
                node.values[0], ast.Constant):
            yield node.lineno, str(node.values[0].value)


def test_no_code_passes_git_an_argument_that_forces_or_deletes() -> None:
    root = Path(__file__).resolve().parents[2]
    found = [f"{path.relative_to(root)}:{line}: {text!r}"
             for package in PRODUCT_CODE for path in sorted((root / package).rglob("*.py"))
             if "migrations" not in path.parts
             for line, text in _string_literals(path)
             if text.startswith(FORCING) or text.startswith("+refs/")]

    assert found == []


def test_worktrees_added_and_removed_concurrently_in_one_repository_all_succeed(
    tmp_path: Path,
) -> None:
    from concurrent.futures import ThreadPoolExecutor

    repo = tmp_path / "clone.git"
    gitops.repo_clone_bare(str(_origin(tmp_path)), repo)
    base = gitops.rev_parse(repo, "refs/heads/main")

    def cycle(n: int) -> bool:
        path = tmp_path / f"tree-{n}" / ("baseline" if n % 2 else "candidate")
        gitops.worktree_add(repo, path, base)
        ok = (path / "README.md").exists() or any(path.iterdir())
        gitops.worktree_remove(repo, path)
        return ok and not path.exists()

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(cycle, range(24)))

    assert results == [True] * 24
    assert gitops.git(repo, "worktree", "list", "--porcelain").count("worktree ") == 1


def test_blob_ids_names_each_present_path_and_none_for_absent_ones(tmp_path: Path) -> None:
    repo = _origin(tmp_path, {"a.txt": "alpha\n", "dir/b.txt": "beta\n"})
    ids = gitops.blob_ids(repo, "refs/heads/main", ["a.txt", "dir/b.txt", "missing.txt", "dir"])

    assert ids["a.txt"] == gitops.git(repo, "rev-parse", "refs/heads/main:a.txt").strip()
    assert ids["dir/b.txt"] == gitops.git(repo, "rev-parse", "refs/heads/main:dir/b.txt").strip()
    assert ids["missing.txt"] is None
    assert ids["dir"] is not None  # a folder has a tree id


def test_git_never_uses_the_fd_transport(tmp_path: Path) -> None:
    """fd:: made git wait on a descriptor of the web process (a thread held 60 s, issue 28);
    the URL policy refuses it first, and git itself is told never to use it."""
    with pytest.raises(gitops.GitError, match="transport 'fd' not allowed"):
        gitops.git(tmp_path, "ls-remote", "fd::0", timeout=30)


class _Redirects(http.server.BaseHTTPRequestHandler):
    """Answers every request with a redirect to /elsewhere/, and counts who followed it."""

    followed: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        if self.path.startswith("/elsewhere/"):
            self.followed.append(self.path)
            self.send_response(404)
        else:
            self.send_response(302)
            self.send_header("Location", "/elsewhere" + self.path)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_git_follows_no_redirect(tmp_path: Path) -> None:
    """The address the URL policy checked is the only one git may reach: a redirect to
    another (a link-local metadata address, say) is not followed."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Redirects)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/repo.git"
        with pytest.raises(gitops.GitError):
            gitops.git(tmp_path, "ls-remote", url, timeout=30)
    finally:
        server.shutdown()
        server.server_close()
    assert _Redirects.followed == []


# --------------------------------------------------------------------------- branch tips


def test_a_branch_tip_read_from_the_files_is_what_git_says_loose_packed_and_moved(
    tmp_path: Path,
) -> None:
    repo = _origin(tmp_path)
    head = gitops.rev_parse(repo, "refs/heads/main")
    assert gitops.branch_tip(repo, "main") == head  # the loose ref
    gitops.git(repo, "pack-refs", "--all")
    assert not (repo / "refs" / "heads" / "main").exists()
    assert gitops.branch_tip(repo, "main") == head  # from packed-refs
    moved = _commit_on(repo, tmp_path, "main", {"README.md": "moved\n"}, "moved")
    gitops.git(repo, "update-ref", "refs/heads/main", moved)
    assert gitops.branch_tip(repo, "main") == moved  # a new loose ref over the packed one
    gitops.git(repo, "branch", "feature/x", head)
    assert gitops.branch_tip(repo, "feature/x") == head


def test_a_branch_tip_that_is_not_a_plain_ref_is_git_s_to_read(tmp_path: Path) -> None:
    repo = _origin(tmp_path)
    head = gitops.rev_parse(repo, "refs/heads/main")
    gitops.git(repo, "symbolic-ref", "refs/heads/alias", "refs/heads/main")
    assert gitops.branch_tip(repo, "alias") == head  # "ref: refs/heads/main": asked of git
    for name in ("nope", "../../HEAD", "main/../main", "-main", ".hidden", "x.lock", "a b"):
        with pytest.raises(GitError):
            gitops.branch_tip(repo, name)
