"""The only module in the product that runs ``git``.

Every call goes through :func:`_run`: a subprocess in its own process group with a
wall-clock timeout, hooks disabled, a cleaned environment and a fixed committer
identity. Nothing here imports Django, so workers, CLIs and tests use it alike.

Contracts shared by every function:

* ``repo`` is the top folder of a repository: a bare repository or a working tree
  (a linked worktree included). Git never searches above it for another repository.
* Failures raise :class:`GitError` (or a subclass) whose message is one sentence
  naming the git command and the first lines of what git printed.
* Nothing is ever forced: pushes and fetches use plain refspecs, branch moves are
  compare-and-swap, and no working tree is ever reset.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

log = logging.getLogger(__name__)

_FULL_SHA = re.compile(r"[0-9a-f]{40}")

GIT_EXECUTABLE = "git"
DEFAULT_TIMEOUT = 60.0

COMMITTER_NAME = "InfraOps"
COMMITTER_EMAIL = "infraops@localhost"

# Prepended to every command. Hooks are off because a hook planted by agent code
# would otherwise run on the host (seen on this machine class); fsmonitor is off
# because it, too, names a program git would run; ext:: would let a repository URL
# run an arbitrary command, and fd:: made git wait on a descriptor of ours (a web thread
# held 60 s). Redirects are not followed: the address infraops/repourls.py checked is the
# only one git may reach.
_SAFETY_OPTIONS = {
    "core.hooksPath": "/dev/null",
    "core.fsmonitor": "false",
    "protocol.file.allow": "always",
    "protocol.ext.allow": "never",
    "protocol.fd.allow": "never",
    "http.followRedirects": "false",
}
_SAFETY_CONFIG = tuple(
    arg for key, value in _SAFETY_OPTIONS.items() for arg in ("-c", f"{key}={value}")
)

# A push to a repository on this machine starts receive-pack here, and git does not
# pass our -c options on to it, so the remote's hooks (pre-receive, update,
# post-receive, reference-transaction) would run on the host. Remotes reached over
# ssh or http run their hooks on their own machine: that is their owner's policy.
_HOOKLESS_RECEIVE_PACK = f"{shlex.quote(GIT_EXECUTABLE)} -c core.hooksPath=/dev/null receive-pack"


# Inherited GIT_* variables are dropped (GIT_DIR, GIT_INDEX_FILE, GIT_CONFIG_* and the
# like would silently point a command at another repository or inject config); these
# only choose how to reach a remote or what to trace, so an operator may set them.
_INHERITED_GIT_VARIABLES = frozenset(
    {
        "GIT_SSH",
        "GIT_SSH_COMMAND",
        "GIT_SSH_VARIANT",
        "GIT_ASKPASS",
        "GIT_SSL_CAINFO",
        "GIT_SSL_CAPATH",
        "GIT_PROXY_COMMAND",
        "GIT_EXEC_PATH",
    }
)

_STDERR_LINES = 3
_COMMAND_CHARS = 200
_KILL_GRACE_SECONDS = 5.0


class GitError(Exception):
    """A git command failed, timed out or could not start.

    ``args[0]`` is one sentence naming the command and git's first lines of output.
    """


class MergeConflict(GitError):
    """The merge would conflict; ``paths`` lists the conflicted files (repo-relative)."""

    def __init__(self, message: str, paths: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.paths: list[str] = list(paths)

    def __reduce__(self) -> tuple[type[MergeConflict], tuple[str, list[str]]]:
        # Keep ``paths`` through pickling (Exception's default reduce drops it).
        return (type(self), (str(self.args[0]), self.paths))


class RefMoved(GitError):
    """The branch was not where the caller expected: it moved since it was read."""


@dataclass(frozen=True)
class _Result:
    returncode: int
    stdout: bytes
    stderr: bytes


# --------------------------------------------------------------------------- running


def _environment(cwd: Path, extra: Mapping[str, str] | None) -> dict[str, str]:
    """The environment for one git call: inherited minus GIT_*, plus our fixed values."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("GIT_")
        or key in _INHERITED_GIT_VARIABLES
        or key.startswith("GIT_TRACE")
    }
    env.update(
        GIT_TERMINAL_PROMPT="0",
        GIT_CONFIG_NOSYSTEM="1",
        LC_ALL="C",
        # Without a ceiling, a folder that is not a repository (a worktree whose .git
        # was deleted) would be taken for whatever repository encloses it.
        GIT_CEILING_DIRECTORIES=str(cwd.parent),
        GIT_COMMITTER_NAME=COMMITTER_NAME,
        GIT_COMMITTER_EMAIL=COMMITTER_EMAIL,
        GIT_AUTHOR_NAME=COMMITTER_NAME,
        GIT_AUTHOR_EMAIL=COMMITTER_EMAIL,
    )
    if extra:
        env.update(extra)
    return env


def _describe(args: Sequence[str]) -> str:
    """The command as a reader would type it, shortened to one line."""
    text = shlex.join(["git", *args])
    return text if len(text) <= _COMMAND_CHARS else text[: _COMMAND_CHARS - 3] + "..."


def _first_lines(output: bytes) -> str:
    lines = [line.strip() for line in output.decode("utf-8", "replace").splitlines()]
    kept = [line for line in lines if line][:_STDERR_LINES]
    return " / ".join(kept) if kept else "(no output)"


def _failure(args: Sequence[str], cwd: Path, result: _Result) -> str:
    detail = _first_lines(result.stderr or result.stdout)
    return f"`{_describe(args)}` in {cwd} failed with exit status {result.returncode}: {detail}"


def _communicate(
    args: Sequence[str], cwd: Path, env: Mapping[str, str], input: bytes | None, timeout: float
) -> _Result:
    """Run one process in a new session; on timeout kill its whole process group."""
    command = [GIT_EXECUTABLE, *_SAFETY_CONFIG, *args]
    try:
        process = subprocess.Popen(
            command,
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as exc:
        raise GitError(f"`{_describe(args)}` in {cwd} could not start: {exc}") from exc
    try:
        stdout, stderr = process.communicate(input=input, timeout=timeout)
    except subprocess.TimeoutExpired:
        # git spawns helpers (remote-http, ssh, pack-objects): kill them all, not just git.
        _kill_group(process)
        raise GitError(
            f"`{_describe(args)}` in {cwd} timed out after {timeout:g} s and was killed."
        ) from None
    return _Result(process.returncode, stdout, stderr)


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    try:
        process.communicate(timeout=_KILL_GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        # A helper that left our process group still holds the pipes; stop waiting.
        process.kill()


def _run(
    cwd: Path,
    args: Sequence[str],
    *,
    timeout: float = DEFAULT_TIMEOUT,
    input: bytes | None = None,
    env: Mapping[str, str] | None = None,
    ok_codes: frozenset[int] = frozenset({0}),
) -> _Result:
    """Run ``git <args>`` in ``cwd``; raise GitError unless the exit status is in ok_codes."""
    if not cwd.is_dir():
        raise GitError(f"`{_describe(args)}` cannot run: folder {cwd} does not exist.")
    cwd = cwd.resolve()
    result = _communicate(args, cwd, _environment(cwd, env), input, timeout)
    if result.returncode not in ok_codes:
        raise GitError(_failure(args, cwd, result))
    return result


def git(
    repo: Path, *args: str, timeout: float = DEFAULT_TIMEOUT, input: bytes | None = None
) -> str:
    """Run ``git <args>`` in ``repo`` and return its stdout.

    Output is decoded as UTF-8, undecodable bytes replaced (use ``read_file`` for exact
    bytes). Raises GitError on a non-zero exit, a timeout, or a missing ``repo`` folder.
    """
    return _run(repo, args, timeout=timeout, input=input).stdout.decode("utf-8", "replace")


# --------------------------------------------------------------------------- checks


def _check_rev(rev: str) -> None:
    # A revision beginning with "-" would be read as an option.
    if not rev or rev.startswith("-") or "\n" in rev or "\0" in rev:
        raise GitError(f"{rev!r} is not a usable revision.")


def _check_branch(repo: Path, branch: str) -> None:
    """Raise GitError unless ``branch`` is a valid short branch name."""
    if branch.startswith("-"):
        raise GitError(f"{branch!r} is not a valid branch name.")
    result = _run(repo, ["check-ref-format", f"refs/heads/{branch}"], ok_codes=frozenset({0, 1}))
    if result.returncode != 0:
        raise GitError(f"{branch!r} is not a valid branch name.")


def _nul_split(output: bytes) -> list[str]:
    return [item.decode("utf-8", "surrogateescape") for item in output.split(b"\0") if item]


# --------------------------------------------------------------------------- repositories


def repo_init_from_dir(src: Path, dest_bare: Path, *, branch: str, message: str) -> str:
    """Create a bare repository at ``dest_bare`` whose ``branch`` is one commit of ``src``.

    ``src`` is read, never written (the index lives in a temporary file inside
    ``dest_bare``; ``.gitignore`` files in ``src`` are honoured). ``dest_bare`` must
    not exist or be empty. Author and committer are the fixed InfraOps identity.
    Returns the commit's sha.
    """
    if not src.is_dir():
        raise GitError(f"cannot create a repository from {src}: it is not a folder.")
    if dest_bare.exists() and any(dest_bare.iterdir()):
        raise GitError(f"cannot create a repository at {dest_bare}: the folder is not empty.")
    dest_bare.mkdir(parents=True, exist_ok=True)
    _check_branch(dest_bare, branch)
    git(dest_bare, "init", "--quiet", "--bare", f"--initial-branch={branch}")
    tree = _tree_of_folder(src.resolve(), dest_bare.resolve())
    sha = _commit_tree(dest_bare, tree, parents=(), message=message)
    # An empty old value makes update-ref refuse if the branch already exists.
    git(dest_bare, "update-ref", "-m", "infraops: initial commit", f"refs/heads/{branch}", sha, "")
    return sha


def _tree_of_folder(src: Path, git_dir: Path) -> str:
    """Write the files of ``src`` as a tree into ``git_dir``; return the tree's sha."""
    index = git_dir / "infraops-import.index"
    env = {"GIT_INDEX_FILE": str(index)}
    where = ["--git-dir", str(git_dir), "--work-tree", str(src)]
    try:
        _run(src, [*where, "add", "--all", "."], env=env)
        return _run(src, [*where, "write-tree"], env=env).stdout.decode().strip()
    finally:
        index.unlink(missing_ok=True)


def repo_clone_bare(url: str, dest: Path, *, timeout: float = 300) -> None:
    """Clone ``url`` as a bare repository at ``dest`` (its branches become ``refs/heads/*``).

    Raises GitError with a sentence naming the URL when the source is unreachable or
    the clone fails or times out; a partial ``dest`` is then removed (only if this
    call created it).
    """
    if url.startswith("-"):
        raise GitError(f"{url!r} is not a usable repository URL.")
    existed = dest.exists()
    dest.parent.mkdir(parents=True, exist_ok=True)
    args = ["clone", "--bare", "--quiet", "--no-tags", "--", url, str(dest.resolve())]
    try:
        _run(dest.parent, args, timeout=timeout)
    except GitError as exc:
        if not existed and dest.exists():
            shutil.rmtree(dest, ignore_errors=True)
        raise GitError(f"could not clone {url!r} into {dest}: {exc.args[0]}") from exc


def repo_fetch(repo: Path, *, remote: str = "origin", timeout: float = 300) -> None:
    """Fetch ``remote``'s branches into ``refs/remotes/<remote>/*`` (never into local branches).

    Local branches are not moved: bring upstream work in with :func:`merge` of
    ``refs/remotes/<remote>/<branch>``. The refspec is not forced, so a branch whose
    upstream history was rewritten is rejected with a GitError naming it; the other
    branches are still updated. Branches deleted upstream are pruned.
    """
    if remote.startswith("-"):
        raise GitError(f"{remote!r} is not a usable remote.")
    refspec = f"refs/heads/*:refs/remotes/{remote}/*"
    git(repo, "fetch", "--quiet", "--prune", "--no-tags", remote, refspec, timeout=timeout)


# --------------------------------------------------------------------------- reading

_SHA = re.compile(rb"[0-9a-f]{40}")
# A branch name read from files without git: git's own rules keep "..", control characters,
# "@{" and the rest out of a ref; this allows the plain names and falls back to git otherwise.
_PLAIN_BRANCH = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._/-]{0,199}")


def branch_tip(repo: Path, branch: str) -> str:
    """The full sha ``refs/heads/<branch>`` points at, read from the repository's files as
    git writes them (the loose ref, else packed-refs): a page that shows whether a base moved
    asks on every read, and a git process each time cost more than the rest of the check.
    Anything else (a symbolic ref, the reftable format, a name with unusual characters, a
    file that does not read as a sha) is git's: ``rev_parse``. Raises GitError as it does."""
    if (not _PLAIN_BRANCH.fullmatch(branch) or ".." in branch or "//" in branch
            or branch.endswith(("/", ".", ".lock")) or "/." in branch
            or (repo / "reftable").exists()):
        return rev_parse(repo, f"refs/heads/{branch}")
    ref = f"refs/heads/{branch}".encode()
    try:
        loose = (repo / "refs" / "heads" / branch).read_bytes().strip()
    except (FileNotFoundError, NotADirectoryError):
        loose = b""
    except OSError:
        return rev_parse(repo, f"refs/heads/{branch}")
    if loose:
        return loose.decode() if _SHA.fullmatch(loose) else rev_parse(repo, ref.decode())
    try:
        packed = (repo / "packed-refs").read_bytes()
    except FileNotFoundError:
        packed = b""
    except OSError:
        return rev_parse(repo, f"refs/heads/{branch}")
    for line in packed.splitlines():
        sha, _, name = line.partition(b" ")
        if name == ref and _SHA.fullmatch(sha):
            return sha.decode()
    raise GitError(f"unknown revision {ref.decode()!r} in {repo}.")


def rev_parse(repo: Path, rev: str) -> str:
    """Resolve ``rev`` to the full sha of a commit (tags are peeled).

    Raises GitError "unknown revision ..." when it names no commit in ``repo``.
    """
    _check_rev(rev)
    result = _run(
        repo, ["rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"], ok_codes=frozenset({0, 1})
    )
    sha = result.stdout.decode().strip()
    if result.returncode != 0 or not sha:
        raise GitError(f"unknown revision {rev!r} in {repo}.")
    return sha


def branch_exists(repo: Path, branch: str) -> bool:
    """True when ``refs/heads/<branch>`` exists in ``repo``."""
    _check_rev(branch)
    result = _run(
        repo,
        ["show-ref", "--verify", "--quiet", f"refs/heads/{branch}"],
        ok_codes=frozenset({0, 1}),
    )
    return result.returncode == 0


def read_file(repo: Path, commit: str, path: str) -> bytes | None:
    """The exact bytes of file ``path`` (repo-relative, ``/``-separated) at ``commit``.

    Returns None when no file is there (absent, or a folder). A symlink gives its
    target text. Raises GitError when ``commit`` itself is unknown.
    """
    sha = rev_parse(repo, commit)
    if "\n" in path or "\0" in path:
        return None
    spec = f"{sha}:{path.lstrip('/')}\n".encode("utf-8", "surrogateescape")
    output = _run(repo, ["cat-file", "--batch"], input=spec).stdout
    header, _, body = output.partition(b"\n")
    # "<sha> <type> <size>", or "<spec> missing" when the path is absent.
    fields = header.split(b" ")
    if len(fields) != 3 or fields[1] != b"blob":
        return None
    return body[: int(fields[2])]


def _commit_id(repo: Path, rev: str) -> str:
    """A full sha as it is (git itself then fails on an unknown one); a name, rev-parsed.
    Saves a git call where the caller already holds shas (experiments do, on a hot path)."""
    return rev if _FULL_SHA.fullmatch(rev) else rev_parse(repo, rev)


def blob_ids(repo: Path, commit: str, paths: Sequence[str]) -> dict[str, str | None]:
    """Git's object id of each path at ``commit`` (None when absent, or when a full sha names
    no commit), in one git call."""
    sha = _commit_id(repo, commit)
    usable = [p for p in paths if "\n" not in p and "\0" not in p]
    spec = "".join(f"{sha}:{p.lstrip('/')}\n" for p in usable).encode("utf-8", "surrogateescape")
    ids: dict[str, str | None] = dict.fromkeys(paths)
    if not usable:
        return ids
    lines = _run(repo, ["cat-file", "--batch-check"], input=spec).stdout.splitlines()
    for path, line in zip(usable, lines, strict=False):
        fields = line.split(b" ")
        ids[path] = fields[0].decode() if len(fields) == 3 else None
    return ids


def list_files(repo: Path, commit: str) -> list[str]:
    """Every file path (repo-relative, recursive) at ``commit``, in git's order."""
    sha = rev_parse(repo, commit)
    output = _run(repo, ["ls-tree", "-r", "-z", "--name-only", "--full-tree", sha]).stdout
    return _nul_split(output)


def diff(repo: Path, base: str, head: str, *, context: int = 3) -> str:
    """The unified diff from ``base`` to ``head`` (two trees compared, like ``base..head``).

    Plain text independent of user config: no colour, no external diff, no textconv,
    ``a/``/``b/`` prefixes, renames shown as a deletion plus an addition (so every
    touched path appears, as in :func:`changed_paths`). Binary files appear as
    "Binary files ... differ".
    """
    old, new = rev_parse(repo, base), rev_parse(repo, head)
    return git(
        repo,
        "diff",
        "--no-color",
        "--no-ext-diff",
        "--no-textconv",
        "--no-renames",
        "--src-prefix=a/",
        "--dst-prefix=b/",
        f"--unified={context}",
        old,
        new,
        "--",
    )


def changed_paths(repo: Path, base: str, head: str) -> list[str]:
    """Every path added, modified or deleted between ``base`` and ``head`` (renames: both)."""
    old, new = rev_parse(repo, base), rev_parse(repo, head)
    args = ["diff", "--name-only", "-z", "--no-renames", "--no-ext-diff", old, new, "--"]
    return _nul_split(_run(repo, args).stdout)


# --------------------------------------------------------------------------- worktrees


def tree_export(repo: Path, commit: str, path: Path) -> None:
    """Write the files of ``commit`` into ``path``, a folder that must not exist yet: a checkout
    without a worktree record or a .git, for probes (nothing on the host runs git in it).

    One git call with an index of its own, deleted afterwards: no lock, nothing to prune, and
    about half the time of ``worktree_add``. Raises GitError for an unknown commit."""
    sha = _commit_id(repo, commit)
    path.mkdir(parents=True)
    index = path.with_name(f".{path.name}.index")
    try:
        _run(repo, ["--work-tree", str(path.resolve()), "read-tree", "--reset", "-u", sha],
             env={"GIT_INDEX_FILE": str(index.resolve())})
    finally:
        index.unlink(missing_ok=True)


def worktree_add(repo: Path, path: Path, commit: str, *, branch: str | None = None) -> None:
    """Check out ``commit`` in a new worktree at ``path`` (which must not exist or be empty).

    Detached when ``branch`` is None; otherwise creates ``branch`` at ``commit`` and
    fails with GitError if that branch already exists.
    """
    sha = _commit_id(repo, commit)
    target = str(path.resolve())
    if branch is not None:
        _check_branch(repo, branch)
    how = ["--detach"] if branch is None else ["-b", branch]
    with _worktree_lock(repo):
        git(repo, "worktree", "add", "--quiet", *how, target, sha)


@contextlib.contextmanager
def _worktree_lock(repo: Path) -> Iterator[None]:
    """Serialise worktree changes in one repository across processes: two concurrent
    `git worktree add` race on the repository's worktree records (seen here: "failed to
    read worktrees/baseline/commondir")."""
    git_dir = repo / ".git" if (repo / ".git").is_dir() else repo
    with (git_dir / "infraops-worktrees.lock").open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def worktree_remove(repo: Path, path: Path) -> None:
    """Delete the worktree at ``path`` with whatever it contains, then prune its records.

    Tolerant when ``path`` is already gone. Refuses (GitError) to delete a folder that
    is not a linked worktree of ``repo``: the check guards against deleting the wrong tree.
    """
    target = path.resolve()
    with _worktree_lock(repo):
        if target.exists():
            if target not in _linked_worktrees(repo):
                raise GitError(f"{path} is not a worktree of {repo}; refusing to delete it.")
            # Deleted by us rather than by `git worktree remove`, which refuses a tree with
            # changes unless forced.
            try:
                shutil.rmtree(target)
            except OSError as exc:
                raise GitError(f"could not delete worktree {path}: {exc}") from exc
        git(repo, "worktree", "prune")


def _linked_worktrees(repo: Path) -> set[Path]:
    """Resolved paths of ``repo``'s linked worktrees (its main tree excluded)."""
    fields = _nul_split(_run(repo, ["worktree", "list", "--porcelain", "-z"]).stdout)
    prefix = "worktree "
    paths = [Path(field[len(prefix) :]).resolve() for field in fields if field.startswith(prefix)]
    return set(paths[1:])


# --------------------------------------------------------------------------- writing


def _identity(author_name: str, author_email: str) -> dict[str, str]:
    return {"GIT_AUTHOR_NAME": author_name, "GIT_AUTHOR_EMAIL": author_email}


# Config keys that make git run a program of the repository's choosing on the host while it
# adds, merges or diffs. InfraOps never sets them, so any such entry was planted.
_DRIVER_KEYS = r"^(filter|merge|diff)\..+\.(clean|smudge|process|driver|textconv|command)$"


def _refuse_planted_drivers(repo: Path) -> None:
    """GitError when the repository's config names a driver program (see _DRIVER_KEYS)."""
    found = _run(repo, ["config", "--get-regexp", _DRIVER_KEYS], ok_codes=frozenset({0, 1}))
    if found.returncode == 0:
        keys = sorted({line.split()[0] for line in found.stdout.decode().splitlines() if line})
        raise GitError(f"the repository at {repo} names driver programs in its git config "
                       f"({', '.join(keys)}); InfraOps never sets these, so nothing runs until "
                       "an operator removes them.")


def commit_all(worktree: Path, message: str, *, author_name: str, author_email: str) -> str | None:
    """Stage every change in ``worktree`` (``git add --all``) and commit it.

    Returns the new commit's sha, or None when nothing changed (no commit is made).
    The committer is the fixed InfraOps identity; no hook runs, and a repository whose
    config names a filter, merge or diff driver is refused (see _refuse_planted_drivers).
    """
    _refuse_planted_drivers(worktree)
    git(worktree, "add", "--all")
    staged = _run(
        worktree, ["diff", "--cached", "--quiet", "--no-ext-diff"], ok_codes=frozenset({0, 1})
    )
    if staged.returncode == 0:
        return None
    _run(
        worktree,
        ["commit", "--quiet", "--no-verify", "--no-gpg-sign", "--cleanup=whitespace", "--file=-"],
        input=message.encode(),
        env=_identity(author_name, author_email),
    )
    return rev_parse(worktree, "HEAD")


def _commit_tree(
    repo: Path,
    tree: str,
    *,
    parents: Sequence[str],
    message: str,
    env: Mapping[str, str] | None = None,
) -> str:
    parent_args = [arg for parent in parents for arg in ("-p", parent)]
    result = _run(
        repo,
        ["commit-tree", "--no-gpg-sign", *parent_args, "-F", "-", tree],
        input=message.encode(),
        env=env,
    )
    return result.stdout.decode().strip()


def _is_ancestor(repo: Path, ancestor: str, descendant: str) -> bool:
    result = _run(
        repo, ["merge-base", "--is-ancestor", ancestor, descendant], ok_codes=frozenset({0, 1})
    )
    return result.returncode == 0


def merge(
    repo: Path,
    *,
    branch: str,
    commit: str,
    expected_base: str | None,
    message: str,
    author_name: str,
    author_email: str,
) -> str:
    """Merge ``commit`` into ``branch`` without touching any working tree; return the new tip.

    * ``expected_base``, when given, must resolve to the branch tip, else RefMoved.
    * Already contained: the tip is returned unchanged. Tip is an ancestor of
      ``commit``: fast-forward (``message`` unused). Otherwise ``git merge-tree
      --write-tree`` checks for conflicts (MergeConflict with the paths; the branch is
      not moved) and a two-parent commit (tip first) records the merge.
    * The branch moves by compare-and-swap; RefMoved if it moved meanwhile.

    A working tree that has ``branch`` checked out is not updated: its files then
    differ from the new tip, so merge into branches nobody has checked out.
    """
    _check_branch(repo, branch)
    _refuse_planted_drivers(repo)
    ref = f"refs/heads/{branch}"
    if not branch_exists(repo, branch):
        raise GitError(f"branch {branch!r} does not exist in {repo}.")
    tip = rev_parse(repo, ref)
    if expected_base is not None and not _names_commit(repo, expected_base, tip):
        raise RefMoved(
            f"branch {branch!r} in {repo} is at {tip}, not at the expected base {expected_base}."
        )
    incoming = rev_parse(repo, commit)
    if _is_ancestor(repo, incoming, tip):
        return tip
    if _is_ancestor(repo, tip, incoming):
        new_tip = incoming
    else:
        tree = _merge_tree(repo, branch=branch, tip=tip, incoming=incoming)
        env = _identity(author_name, author_email)
        new_tip = _commit_tree(repo, tree, parents=(tip, incoming), message=message, env=env)
    _compare_and_swap(repo, branch=branch, new=new_tip, old=tip)
    return new_tip


def merge_commit(
    repo: Path, *, tip: str, incoming: str, message: str, author_name: str, author_email: str
) -> str:
    """Write a two-parent commit (``tip`` first) of the merged trees of ``tip`` and
    ``incoming`` and return its sha; no branch moves. MergeConflict (with the paths) when
    they conflict. Always a real merge commit, even when ``tip`` is an ancestor of
    ``incoming``, so the history keeps the message that says who merged what and why."""
    _refuse_planted_drivers(repo)
    tip, incoming = rev_parse(repo, tip), rev_parse(repo, incoming)
    tree = _merge_tree(repo, branch=tip[:12], tip=tip, incoming=incoming)
    return _commit_tree(repo, tree, parents=(tip, incoming), message=message,
                        env=_identity(author_name, author_email))


def is_ancestor(repo: Path, ancestor: str, descendant: str) -> bool:
    """True when ``ancestor`` is ``descendant`` or one of its ancestors."""
    return _is_ancestor(repo, rev_parse(repo, ancestor), rev_parse(repo, descendant))


def keep_ref(repo: Path, name: str, commit: str) -> None:
    """Point ``refs/infraops/<name>`` at ``commit`` so git's gc keeps an unmerged commit."""
    if not re.fullmatch(r"[a-z0-9][a-z0-9/-]{0,100}", name) or "//" in name:
        raise GitError(f"{name!r} is not a usable ref name.")
    git(repo, "update-ref", f"refs/infraops/{name}", rev_parse(repo, commit))


def _names_commit(repo: Path, rev: str, sha: str) -> bool:
    """True when ``rev`` resolves to ``sha``; an unknown ``rev`` names no commit at all."""
    try:
        return rev_parse(repo, rev) == sha
    except GitError:
        return False


def _merge_tree(repo: Path, *, branch: str, tip: str, incoming: str) -> str:
    """The merged tree of ``tip`` and ``incoming``; MergeConflict when they conflict."""
    args = ["merge-tree", "--write-tree", "--name-only", "--no-messages", "-z", tip, incoming]
    result = _run(repo, args, ok_codes=frozenset({0, 1}))
    tree, *paths = _nul_split(result.stdout)
    if result.returncode == 1:
        conflicted = list(dict.fromkeys(paths))
        raise MergeConflict(
            f"`{_describe(args)}` found conflicts merging {incoming} into branch {branch!r} "
            f"in {repo}: {', '.join(conflicted) or '(no paths reported)'}.",
            conflicted,
        )
    return tree


def _compare_and_swap(repo: Path, *, branch: str, new: str, old: str) -> None:
    """Move ``branch`` from ``old`` to ``new``; RefMoved if it is no longer at ``old``."""
    ref = f"refs/heads/{branch}"
    try:
        git(repo, "update-ref", "-m", f"infraops: merge {new}", ref, new, old)
    except GitError as exc:
        now = rev_parse(repo, ref) if branch_exists(repo, branch) else "(deleted)"
        if now != old:
            raise RefMoved(
                f"branch {branch!r} in {repo} moved from {old} to {now} during the merge."
            ) from exc
        raise


def branch_move(repo: Path, branch: str, *, new: str, old: str) -> None:
    """Move ``branch`` from ``old`` to ``new`` by compare-and-swap (RefMoved if it is not at
    ``old``); used to take back a merge whose push was rejected."""
    _check_branch(repo, branch)
    _compare_and_swap(repo, branch=branch, new=rev_parse(repo, new), old=rev_parse(repo, old))


def push(repo: Path, remote: str, branch: str, *, timeout: float = 120) -> None:
    """Push local ``branch`` to the same branch on ``remote`` (a name or a URL).

    A plain push: the remote accepts only a fast-forward (or a new branch); a
    rejection raises GitError naming the command and git's reason.
    """
    if remote.startswith("-"):
        raise GitError(f"{remote!r} is not a usable remote.")
    _check_branch(repo, branch)
    # Full ref names on both sides: the refspec can never start with "+", which forces.
    refspec = f"refs/heads/{branch}:refs/heads/{branch}"
    args = ["push", "--quiet", "--no-verify", "--porcelain"]
    if _is_local_url(_remote_url(repo, remote)):
        args.append(f"--receive-pack={_HOOKLESS_RECEIVE_PACK}")
    git(repo, *args, remote, refspec, timeout=timeout)


def _remote_url(repo: Path, remote: str) -> str:
    """The URL behind ``remote``: a configured remote's URL, else ``remote`` itself."""
    names = git(repo, "remote").split()
    return git(repo, "remote", "get-url", remote).strip() if remote in names else remote


def _is_local_url(url: str) -> bool:
    """Whether git reaches ``url`` through a local path (git's own rule, minus Windows drives)."""
    if url.startswith("file://"):
        return True
    if "://" in url:
        return False
    colon, slash = url.find(":"), url.find("/")
    # "host:path" is scp-like ssh; a "/" before the first ":" makes it a path.
    return colon == -1 or (slash != -1 and slash < colon)


# --------------------------------------------------------------------------- over HTTP
#
# A worker on another host keeps its own cache of a target's repository and fetches commits
# from the web's git endpoint (infraops.experiments.remote). Headers travel in the
# environment (GIT_CONFIG_COUNT), never on a command line another user of the host could read.


def _header_config(headers: Mapping[str, str]) -> dict[str, str]:
    env = {"GIT_CONFIG_COUNT": str(len(headers))}
    for i, (name, value) in enumerate(headers.items()):
        if "\n" in name or "\n" in value or "\r" in value:
            raise GitError(f"header {name!r} holds a line break.")
        env[f"GIT_CONFIG_KEY_{i}"] = "http.extraHeader"
        env[f"GIT_CONFIG_VALUE_{i}"] = f"{name}: {value}"
    return env


def repo_init_bare(dest: Path) -> None:
    """An empty bare repository at ``dest`` (nothing when one is there)."""
    if (dest / "HEAD").is_file():
        return
    dest.mkdir(parents=True, exist_ok=True)
    _run(dest, ["init", "--bare", "--quiet", str(dest.resolve())])


def missing_commits(repo: Path, commits: Sequence[str]) -> list[str]:
    """The commits of ``commits`` (full shas) that ``repo`` does not hold."""
    missing = []
    for commit in commits:
        if not _FULL_SHA.fullmatch(commit):
            raise GitError(f"{commit!r} is not a full commit id.")
        result = _run(repo, ["cat-file", "-e", f"{commit}^{{commit}}"],
                      ok_codes=frozenset({0, 1, 128}))
        if result.returncode != 0:
            missing.append(commit)
    return missing


def fetch_commits(repo: Path, url: str, commits: Sequence[str], *,
                  headers: Mapping[str, str] | None = None, timeout: float = 300) -> None:
    """Fetch ``commits`` (full shas) and their history from ``url`` into ``repo``, each kept
    by a ref ``refs/infraops/cache/<sha>`` so that no gc drops it. Git negotiates with what
    the repository holds: a second fetch carries only the new objects. A fetch that fails
    leaves the repository as it was (git writes objects before refs, and refs only at the end)."""
    if url.startswith("-"):
        raise GitError(f"{url!r} is not a usable repository URL.")
    wanted = list(dict.fromkeys(commits))
    for commit in wanted:
        if not _FULL_SHA.fullmatch(commit):
            raise GitError(f"{commit!r} is not a full commit id.")
    if not wanted:
        return
    refspecs = [f"{commit}:refs/infraops/cache/{commit}" for commit in wanted]
    _run(repo, ["fetch", "--quiet", "--no-tags", "--no-write-fetch-head", url, *refspecs],
         timeout=timeout, env=_header_config(headers or {}))


def push_refs(repo: Path, url: str, refs: Mapping[str, str], *,
              headers: Mapping[str, str] | None = None, timeout: float = 300) -> None:
    """Set each ref of ``refs`` (a full ref name -> a commit of ``repo``) on ``url``.

    Not forced: the remote takes a new ref or a fast-forward and refuses the rest in words."""
    if url.startswith("-"):
        raise GitError(f"{url!r} is not a usable repository URL.")
    refspecs = []
    for ref, commit in refs.items():
        if not ref.startswith("refs/") or not _FULL_SHA.fullmatch(commit):
            raise GitError(f"cannot push {commit!r} to {ref!r}: a full ref name and commit id "
                           "are needed.")
        refspecs.append(f"{commit}:{ref}")
    _run(repo, ["push", "--quiet", "--no-verify", "--porcelain", url, *refspecs],
         timeout=timeout, env=_header_config(headers or {}))


# --------------------------------------------------------------------------- smart HTTP

HTTP_BACKEND_TIMEOUT = 1800.0
_CGI_CHUNK = 1 << 16
# Given to `git http-backend` and, through GIT_CONFIG_PARAMETERS, to the upload-pack and
# receive-pack it starts: a worker fetches a commit by its id (the experiment's pinned
# candidate, which may be on no branch), and the caller has authenticated the worker and
# checked every ref of a push before receive-pack runs.
_HTTP_BACKEND_CONFIG = ("-c", "uploadpack.allowAnySHA1InWant=true", "-c", "http.uploadpack=true",
                        "-c", "http.receivepack=true", "-c", "receive.denyDeletes=true")


@dataclass
class CgiAnswer:
    """What `git http-backend` answered: its status, its headers, and its body as an iterator
    that waits for the process at the end (and kills it when the iterator is closed early)."""

    status: int
    headers: list[tuple[str, str]]
    body: Iterator[bytes]


def http_backend(repo: Path, *, path: str, method: str, query: str, content_type: str,
                 body: IO[bytes] | None, user: str,
                 timeout: float = HTTP_BACKEND_TIMEOUT) -> CgiAnswer:
    """Serve git's smart HTTP for the bare repository ``repo`` through ``git http-backend``.

    ``path`` follows the repository in the URL ("/info/refs", "/git-upload-pack"); ``body``
    is the request's uncompressed body as a real file (or None), read from where it stands.
    The process is killed, with its children, after ``timeout`` seconds or when the answer's
    body is closed unread.
    """
    if not (repo / "HEAD").is_file():
        raise GitError(f"{repo} is not a repository.")
    env = _environment(repo, {
        "GIT_PROJECT_ROOT": str(repo.parent), "GIT_HTTP_EXPORT_ALL": "1",
        "PATH_INFO": f"/{repo.name}{path}", "REQUEST_METHOD": method, "QUERY_STRING": query,
        "CONTENT_TYPE": content_type, "REMOTE_USER": user, "REMOTE_ADDR": "127.0.0.1",
        "GATEWAY_INTERFACE": "CGI/1.1",
    })
    if body is not None:
        # The process reads the file descriptor: put it where the Python file stands (a
        # buffered seek within what was read already moves no descriptor).
        body.flush()
        os.lseek(body.fileno(), body.tell(), os.SEEK_SET)
    stderr = tempfile.TemporaryFile()  # noqa: SIM115 (closed when the body ends)
    try:
        process = subprocess.Popen(
            [GIT_EXECUTABLE, *_SAFETY_CONFIG, *_HTTP_BACKEND_CONFIG, "http-backend"],
            cwd=repo, env=env, stdin=body if body is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=stderr, start_new_session=True)
    except OSError as exc:
        stderr.close()
        raise GitError(f"`git http-backend` in {repo} could not start: {exc}") from exc
    watchdog = threading.Timer(timeout, _kill_group, (process,))
    watchdog.daemon = True
    watchdog.start()
    assert process.stdout is not None
    status, headers = _cgi_head(process.stdout)
    return CgiAnswer(status, headers, _cgi_body(process, watchdog, stderr))


def _cgi_head(stdout: IO[bytes]) -> tuple[int, list[tuple[str, str]]]:
    """The CGI's status ("Status: 404 Not Found"; 200 without one) and other headers."""
    status, headers = 200, []
    while line := stdout.readline(8192).rstrip(b"\r\n"):
        name, _, value = line.decode("latin-1").partition(":")
        if name.strip().lower() == "status":
            code = value.split()[:1]
            status = int(code[0]) if code and code[0].isdigit() else 500
        else:
            headers.append((name.strip(), value.strip()))
    return status, headers


def _cgi_body(process: subprocess.Popen[bytes], watchdog: threading.Timer,
              stderr: IO[bytes]) -> Iterator[bytes]:
    assert process.stdout is not None
    try:
        while chunk := process.stdout.read1(_CGI_CHUNK):  # type: ignore[attr-defined]
            yield chunk
        process.wait()
    finally:
        watchdog.cancel()
        if process.poll() is None:
            _kill_group(process)
        elif process.returncode:
            stderr.seek(0)
            log.warning("`git http-backend` exited with status %s: %s", process.returncode,
                        _first_lines(stderr.read(4096)))
        process.stdout.close()
        stderr.close()


@dataclass(frozen=True)
class PushCommand:
    """One ref update of a push: ``old`` and ``new`` object ids (all zeros: none)."""

    old: str
    new: str
    ref: str

    @property
    def is_deletion(self) -> bool:
        return set(self.new) == {"0"}


_PUSH_COMMAND = re.compile(r"([0-9a-f]{40}|[0-9a-f]{64}) ([0-9a-f]{40}|[0-9a-f]{64}) (\S+)")
_PKT_MAX = 65520
_PUSH_COMMANDS_MAX = 10000


def receive_pack_commands(body: IO[bytes]) -> list[PushCommand]:
    """The ref updates at the head of a receive-pack request (pkt-lines up to the first flush,
    before the pack), read from ``body``'s current position; GitError in words when they are
    not git's push protocol. Shallow lines are skipped; a signed push (push-cert) is refused."""
    commands: list[PushCommand] = []
    while True:
        size_text = body.read(4)
        try:
            size = int(size_text, 16) if len(size_text) == 4 else -1
        except ValueError:
            size = -1
        if size == 0:
            return commands
        if not 4 < size <= _PKT_MAX or len(commands) >= _PUSH_COMMANDS_MAX:
            raise GitError("the push request does not begin with git's ref update lines.")
        line = body.read(size - 4).split(b"\0", 1)[0].rstrip(b"\n").decode("utf-8", "replace")
        if line.startswith("shallow "):
            continue
        if line.startswith("push-cert"):
            raise GitError("signed pushes (push-cert) are not accepted here.")
        match = _PUSH_COMMAND.fullmatch(line)
        if match is None:
            raise GitError(f"the push request has a ref update git would not send: {line[:100]!r}.")
        commands.append(PushCommand(*match.groups()))

