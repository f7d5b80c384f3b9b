"""Registering a target and refreshing its manifest from its base branch."""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Sequence
from pathlib import Path

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from infraops import gitops
from infraops.errors import DomainError
from infraops.grants import membership_grant
from infraops.manifest import MANIFEST_PATH, Manifest, ManifestError, parse_manifest
from infraops.models import Target, TargetMembership
from infraops.repourls import RepoUrlPolicy, RepoUrlRefused, repo_url_check
from infraops.roles import ROLES
from infraops.services.audit import audit_record


def repo_url_policy(*, trusted_roots: Sequence[Path] = ()) -> RepoUrlPolicy:
    """The installation's repository URL policy (INFRAOPS_REPO_* settings). The data folder
    and the checkout are always protected; `trusted_roots` are folders the calling code (a
    command, a bench) made its own repositories in, never a form's input."""
    return RepoUrlPolicy(
        schemes=frozenset(settings.REPO_SCHEMES), hosts=tuple(settings.REPO_HOSTS),
        local_roots=tuple(Path(root) for root in settings.REPO_LOCAL_ROOTS),
        protected=(Path(settings.DATA_DIR), Path(settings.BASE_DIR)),
        private_addresses=settings.REPO_PRIVATE_ADDRESSES, trusted_roots=tuple(trusted_roots),
    )


def repo_url_allowed(*, url: str, trusted_roots: Sequence[Path] = ()) -> None:
    """Raise DomainError with a sentence when `url` is outside the policy (repo_url_policy).
    No git runs: a form checks this in its request, and a worker does the rest."""
    try:
        repo_url_check(url, repo_url_policy(trusted_roots=trusted_roots))
    except RepoUrlRefused as exc:
        raise DomainError(str(exc)) from None


def repo_check(*, url: str, branch: str, trusted_roots: Sequence[Path] = ()) -> None:
    """Raise DomainError with a sentence when `url` is outside the policy (repo_url_policy),
    unreachable, or lacks `branch`. The policy is checked before git runs at all."""
    repo_url_allowed(url=url, trusted_roots=trusted_roots)
    try:
        heads = gitops.git(Path("/"), "ls-remote", "--heads", "--", url, branch, timeout=60)
    except gitops.GitError as exc:
        raise DomainError(f"The repository {url!r} cannot be read: {exc}") from None
    if not heads.strip():
        raise DomainError(f"The repository {url!r} has no branch {branch!r}.")


def target_register(
    *, name: str, repo_url: str, base_branch: str, push_on_merge: bool = False,
    user: User | None = None, trusted_roots: Sequence[Path] = (),
) -> Target:
    """Create the target, clone it (bare) into the data folder and read its manifest.
    `repo_url` must pass the URL policy (repo_check; `trusted_roots` as there)."""
    repo_check(url=repo_url, branch=base_branch, trusted_roots=trusted_roots)
    with transaction.atomic():
        target = Target.objects.create(
            name=name, repo_url=repo_url, base_branch=base_branch,
            push_on_merge=push_on_merge, created_by=user,
        )
        target_clone(target=target)
        target_refresh_manifest(target=target)
        audit_record(actor=user, action="target.register", obj=target, data={"repo": repo_url})
    return target


def first_role(user: User) -> str | None:
    """The user's first global role in the order engineer, reviewer, viewer."""
    names = set(user.groups.values_list("name", flat=True))
    return next((role for role in ROLES if role in names), None)


def target_add_role_holders(*, target: Target, actor: User | None = None) -> list[User]:
    """Every user who holds a global role and is not a member of `target` yet joins it in
    their first role (superusers see every target without). For a new installation's first
    target: `manage.py load_example`, and `adduser --target`. Returns who joined."""
    joined = []
    for user in User.objects.filter(is_superuser=False, groups__name__in=ROLES).distinct():
        role = first_role(user)
        if role is None:
            continue
        if TargetMembership.objects.filter(target=target, user=user).exists():
            continue
        membership_grant(target=target, user=user, role=role, by=actor,
                         by_label="manage.py (the target's first members)")
        joined.append(user)
    return joined


def target_clone(*, target: Target) -> None:
    """Make (or remake) InfraOps' bare clone of the target's repository."""
    dest = target.clone_path
    if dest.exists():
        shutil.rmtree(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        gitops.repo_clone_bare(target.repo_url, dest)
    except gitops.GitError as exc:
        raise DomainError(f"Cloning {target.repo_url!r} failed: {exc}") from None


def target_manifest_at(*, target: Target, commit: str, repo: Path | None = None) -> Manifest:
    """The target's infraops.toml at `commit`: its stored copy when that is the commit it was
    read at, else read from git (`repo`, default the target's clone). DomainError when the
    commit has none; ManifestError when it does not parse."""
    if commit == target.manifest_commit and target.manifest_text:
        return parse_manifest(target.manifest_text)
    raw = gitops.read_file(repo or target.clone_path, commit, "infraops.toml")
    if raw is None:
        raise DomainError(f"infraops.toml is missing at {commit[:10]}.")
    return parse_manifest(raw.decode("utf-8", "replace"))


UPSTREAM_AUTHOR = ("InfraOps", "infraops@localhost")


def _follow_upstream(target: Target) -> None:
    """Bring the upstream base branch into the clone's: fetch only moves
    refs/remotes/origin/*, and the clone's own branch (what runs start from, what merges go
    onto) stayed where it was cloned. Fast-forward when upstream is ahead; nothing when the
    clone is ahead (changes merged here and not pushed); a merge commit when both moved. A
    conflict between the two is an error that names the paths: nothing moves."""
    base = target.base_branch
    try:
        gitops.rev_parse(target.clone_path, f"refs/remotes/origin/{base}")
    except gitops.GitError:
        raise DomainError(f"The upstream repository has no branch {base!r} (any more): "
                          "InfraOps keeps the copy it has; fix the target's base branch.") from None
    try:
        gitops.merge(target.clone_path, branch=base, commit=f"refs/remotes/origin/{base}",
                     expected_base=None, message=f"infraops: bring in upstream {base}",
                     author_name=UPSTREAM_AUTHOR[0], author_email=UPSTREAM_AUTHOR[1])
    except gitops.MergeConflict as exc:
        raise DomainError(f"Upstream {base} and the changes merged here conflict in "
                          f"{', '.join(exc.paths) or 'some paths'}: resolve it upstream (merge "
                          f"{base} there), then refresh.") from None


def target_refresh_manifest(*, target: Target) -> Target:
    """Fetch, bring the upstream base branch in (_follow_upstream), then read and validate
    infraops.toml at the tip of the base branch.

    A broken manifest is stored with its problems (the target page lists them); the previous
    text is replaced, since experiments record the hash of the manifest they ran with.
    """
    if not target.clone_path.exists():
        target_clone(target=target)
    try:
        gitops.repo_fetch(target.clone_path)
        _follow_upstream(target)
        commit = gitops.rev_parse(target.clone_path, f"refs/heads/{target.base_branch}")
        raw = gitops.read_file(target.clone_path, commit, MANIFEST_PATH)
    except gitops.GitError as exc:
        raise DomainError(f"Reading {target.name}'s repository failed: {exc}") from None
    text = raw.decode("utf-8", errors="replace") if raw is not None else ""
    errors: list[str] = []
    if raw is None:
        errors = [f"{MANIFEST_PATH} is missing at the tip of {target.base_branch}."]
    else:
        try:
            parse_manifest(text)
        except ManifestError as exc:
            errors = [str(problem) for problem in exc.problems]
    target.manifest_commit = commit
    target.manifest_text = text
    target.manifest_sha256 = hashlib.sha256(raw or b"").hexdigest()
    target.manifest_errors = errors
    target.refreshed_at = timezone.now()
    target.save(update_fields=[
        "manifest_commit", "manifest_text", "manifest_sha256", "manifest_errors", "refreshed_at",
    ])
    return target


# --- the repository's git work, in a worker ----------------------------------------------------
# Issue 28: a form that ran git in its request held a web thread for a minute or more on a URL
# that hangs (eight filled the pool). A form records what to fetch; a worker task with a
# deadline (infraops.tasks.target_fetch) fetches; the target's page says where it stands.

def target_fetch_request(*, target: Target, check: bool, reclone: bool) -> None:
    """Mark the target as being fetched and hand the git work to a worker after the commit.
    `check`: the URL or branch is new, so the worker checks them first (repo_check);
    `reclone`: the URL is new, so the clone is made again."""
    Target.objects.filter(pk=target.pk).update(
        fetch_status=Target.Fetch.FETCHING, fetch_error="", fetch_requested_at=timezone.now())
    target.refresh_from_db(fields=["fetch_status", "fetch_error", "fetch_requested_at"])
    pk = target.pk
    transaction.on_commit(lambda: _send_fetch(pk, check=check, reclone=reclone))


def queue_fetch(target_id: int, check: bool, reclone: bool) -> None:
    """Send infraops.tasks.target_fetch by name: the tasks module imports this one."""
    from celery import current_app

    current_app.send_task("infraops.tasks.target_fetch", (target_id, check, reclone))


def _send_fetch(target_id: int, *, check: bool, reclone: bool) -> None:
    from kombu.exceptions import OperationalError
    from redis.exceptions import RedisError

    try:
        queue_fetch(target_id, check, reclone)
    except (OperationalError, RedisError, OSError):
        target_fetch_failed(target_id=target_id, reason=(
            "the task queue (Redis) was not answering, so nothing was fetched: refresh the "
            "target once it is back"))


def target_fetch(*, target_id: int, check: bool, reclone: bool) -> Target | None:
    """The worker's half of target_fetch_request: check the URL and its branch (when new),
    clone (when asked, or when there is no clone yet), read the manifest; record ready, or
    failed with the reason. None when the target was deleted meanwhile."""
    target = Target.objects.filter(pk=target_id).first()
    if target is None:
        return None
    try:
        if check:
            repo_check(url=target.repo_url, branch=target.base_branch)
        if reclone:
            target_clone(target=target)
        target_refresh_manifest(target=target)
    except DomainError as exc:
        target_fetch_failed(target_id=target_id, reason=str(exc))
    else:
        Target.objects.filter(pk=target_id).update(fetch_status=Target.Fetch.READY,
                                                   fetch_error="")
    target.refresh_from_db()
    return target


def target_fetch_failed(*, target_id: int, reason: str) -> None:
    Target.objects.filter(pk=target_id).update(fetch_status=Target.Fetch.FAILED,
                                               fetch_error=reason[:2000])
