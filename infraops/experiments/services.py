"""Experiments: request, claim with a lease, execute probes sandboxed, analyse, reap.

Safe to run twice: an execution is owned by (claimed_by, attempt) and every write checks it;
results are unique per attempt, so a re-delivered task never records a result twice.

Leases: a claim holds the experiment for its lease (INFRAOPS_EXPERIMENT_LEASE_SECONDS, 60 s by
default); a heartbeat thread renews it while probes run.
A task redelivered on the same host after its worker process died takes over at once (the
holder's pid is gone); elsewhere the reaper re-queues it once the lease has expired.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import random
import shlex
import shutil
import socket
import threading
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any, Final

from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.contrib.auth.models import User
from django.db import IntegrityError, connection, transaction
from django.db.models import DateTimeField, F, Q, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from infraops import gitops
from infraops.access import has_target_role
from infraops.dbretry import retried
from infraops.errors import DomainError, Forbidden, WorkerNotAccepted
from infraops.experiments import sandbox
from infraops.experiments.accelerators import ProbeAccess, probe_access
from infraops.experiments.analysis import (
    attempt_executions,
    attempt_samples,
    experiment_feedback,
    look_state,
    sample_plan,
)
from infraops.experiments.results import (
    LogStream,
    MetricRow,
    artifacts_collect,
    artifacts_link,
    experiment_changed,
    instruction_rows,
    printable,
    read_metrics,
    samples_copy,
)
from infraops.experiments.workers import live_queues
from infraops.feedback.samples import SampleRow, compare_samples, per_execution_rows
from infraops.manifest import Manifest, ManifestError, Probe
from infraops.models import (
    Artifact,
    Experiment,
    ProbeExecution,
    Target,
    parse_variant,
    variant_key,
)
from infraops.roles import ENGINEER
from infraops.services.audit import audit_record
from infraops.services.targets import target_manifest_at
from infraops.signals import experiment_finished

log = logging.getLogger(__name__)

RENEW_EVERY = 15.0  # seconds, for the default 60 s lease: a quarter of the lease


def lease() -> timedelta:
    """How long a claim holds an experiment without a renewal: what a lost host costs before
    the reaper sends its experiment to another worker."""
    return timedelta(seconds=settings.EXPERIMENT_LEASE_SECONDS)


def renew_every() -> float:
    return RENEW_EVERY * float(settings.EXPERIMENT_LEASE_SECONDS) / 60.0
REQUEUE_QUEUED_AFTER = timedelta(minutes=2)
KEPT_OUTPUT_BYTES = 64_000
SIDES = (ProbeExecution.Side.BASELINE, ProbeExecution.Side.CANDIDATE)
DEFAULT_MARGIN = 0.01
MAX_MARGIN = 0.5


def margin_of(goal_spec: dict[str, Any] | None) -> float:
    """The equivalence margin a goal version asks for: its smallest meaningful effect, else
    DEFAULT_MARGIN."""
    value = (goal_spec or {}).get("min_effect")
    return _clamped(float(value)) if isinstance(value, int | float) else DEFAULT_MARGIN


def margin_metric_of(goal_spec: dict[str, Any] | None) -> str:
    """The goal's own metric, "probe.metric": the one its smallest meaningful effect is of."""
    spec = goal_spec or {}
    return f"{spec['probe']}.{spec['metric']}" if spec.get("probe") and spec.get("metric") else ""


def _clamped(margin: float | None) -> float:
    """A usable margin: (0, MAX_MARGIN]; anything else is the default (a margin at or over 1
    would make every comparison fail to compute, so no regression could block)."""
    if margin is None or not (0 < margin <= MAX_MARGIN):
        return DEFAULT_MARGIN
    return margin


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def queue_for(probes: Sequence[Probe]) -> str:
    """experiments, or experiments.<req>[.<req>] for probes that need hardware."""
    needs = sorted({req for probe in probes for req in probe.requires})
    return "experiments" + "".join(f".{req}" for req in needs)


def select_probes(manifest: Manifest, names: Sequence[str], changed: Sequence[str]) -> list[Probe]:
    """Named probes, or else those covering a changed path plus those marked always;
    cheapest first."""
    if names:
        unknown = [n for n in names if manifest.probe(n) is None]
        if unknown:
            raise DomainError(f"Unknown probe(s): {', '.join(unknown)}.")
        chosen = [p for p in manifest.probes if p.name in names]
    else:
        chosen = [p for p in manifest.probes if p.always or p.covers_any(changed)]
    return sorted(chosen, key=lambda p: p.cost)


def servable(chosen: list[Probe]) -> tuple[list[Probe], list[Probe]]:
    """Probes chosen by the paths they cover, less those needing hardware that no live worker
    has, when others remain (the left-out ones second): a change to code that a GPU probe
    also covers would otherwise wait for a GPU worker that may never come. Probes named
    by the caller are never left out: their experiment waits for its worker."""
    live = live_queues()
    if live is None:
        return chosen, []
    kept = [p for p in chosen if not p.requires or queue_for([p]) in live]
    if not kept:
        return chosen, []
    return kept, [p for p in chosen if p not in kept]


MAX_CELLS_NAMED = 20  # cells listed in an error about an unknown cell


def chosen_variants(probes: Sequence[Probe], variants: Mapping[str, Sequence[str]] | None
                    ) -> dict[str, list[str]]:
    """The variant cells asked for, per probe, canonical (variant_key) and in matrix order.

    Each key must name one of `probes`, and each cell one of that probe's variant_matrix
    cells; a cell may be written with its keys in any order and spaces around '=' and ','.
    DomainError names the probe's cells otherwise. None or {} means every cell of every probe.
    """
    by_name = {probe.name: probe for probe in probes}
    result: dict[str, list[str]] = {}
    for name, cells in (variants or {}).items():
        probe = by_name.get(name)
        if probe is None:
            raise DomainError(f"Variants name probe {name!r}, which this experiment does not "
                              f"run; its probes: {', '.join(by_name) or 'none'}.")
        wanted = {_cell_key(probe, cell) for cell in cells}
        if not wanted:
            raise DomainError(f"No variant cell chosen for probe {name!r}: list at least one, "
                              "or leave the probe out to run every cell.")
        result[name] = [key for key in map(variant_key, probe.variant_matrix()) if key in wanted]
    return result


def _cell_key(probe: Probe, cell: str) -> str:
    """`cell` of `probe` as variant_key spells it; DomainError naming the cells when the
    probe has no such cell."""
    keys = [variant_key(v) for v in probe.variant_matrix()]
    try:
        key = variant_key(parse_variant(cell))
    except ValueError as exc:
        key, problem = None, f" ({exc})"
    else:
        problem = ""
    if key in keys:
        return key
    shown = ", ".join(f"[{k}]" if k else "[] (no variants)" for k in keys[:MAX_CELLS_NAMED])
    more = f" and {len(keys) - MAX_CELLS_NAMED} more" if len(keys) > MAX_CELLS_NAMED else ""
    raise DomainError(f"Probe {probe.name!r} has no variant cell {cell!r}{problem}; its cells: "
                      f"{shown}{more}.")


def experiment_request(
    *, target: Target, candidate_commit: str, baseline_commit: str,
    probes: Sequence[str] = (), origin: str = "", stop_on_failure: bool = True,
    criteria: Sequence[dict[str, Any]] = (), margin: float | None = None,
    margin_metric: str = "", variants: Mapping[str, Sequence[str]] | None = None,
    seed: int | None = None, send: bool = True,
) -> Experiment:
    """Queue an experiment; its task is sent after commit, to the queue its probes need
    (`send` False: not sent, the caller runs it with experiment_execute).
    `margin` is the equivalence margin of the comparisons of `margin_metric` ("probe.metric";
    blank: of every metric); other metrics use DEFAULT_MARGIN. `variants` runs only the named
    cells of the probes it names (see chosen_variants; DomainError when one does not exist);
    the probes it does not name run every cell. `seed` is every sample's INFRAOPS_SEED (None:
    drawn when it runs): experiments that share one compare their candidates on the same
    inputs (common random numbers)."""
    manifest = target.manifest()
    if manifest is None:
        raise DomainError(f"{target.name} has no valid infraops.toml: fix it before experimenting.")
    try:
        changed = gitops.changed_paths(target.clone_path, baseline_commit, candidate_commit)
    except gitops.GitError as exc:
        raise DomainError(f"The revisions cannot be compared: {exc}") from None
    chosen = select_probes(manifest, probes, changed)
    if not chosen:
        raise DomainError("No probe covers the changed paths ("
                          + (", ".join(changed[:5]) or "none") + ") and none is marked always.")
    if not probes:
        chosen, unserved = servable(chosen)
        if unserved:
            origin = (f"{origin} (left out: {', '.join(p.name for p in unserved)}; no live "
                      "worker has the hardware they require)").strip()
    cells = chosen_variants(chosen, variants)
    experiment = Experiment.objects.create(
        target=target, candidate_commit=candidate_commit, baseline_commit=baseline_commit,
        probes=[p.name for p in chosen], variants=cells, changed_paths=changed[:1000],
        queue=queue_for(chosen),
        origin=origin, manifest_sha256=target.manifest_sha256, stop_on_failure=stop_on_failure,
        enqueued_at=timezone.now(), criteria=list(criteria),
        margin=_clamped(margin), margin_metric=margin_metric[:201], seed=seed,
    )
    if send:
        _send_after_commit(experiment.pk, experiment.queue)
    return experiment


def experiment_compare(*, target: Target, candidate: str, base: str = "",
                       probes: Sequence[str] = (), send: bool = True,
                       user: User | None = None, fetch: bool = True) -> Experiment:
    """Queue an experiment of any two revisions of the target (branch, tag or sha; `base`
    blank: the base branch's tip), for a person rather than a run: what the target page and
    `manage.py experiment` ask. `user`: the person asking from the page, an engineer of the
    target (Forbidden otherwise), recorded in the audit log; None: the command line, run by
    whoever runs the host. A revision the clone does not know is looked for upstream (fetched,
    then its `origin/` branch); with `fetch` False (a web request: the git work that can hang
    is a worker's, issue 28) only in the clone as its worker last fetched it. DomainError
    names a revision found nowhere."""
    if user is not None and not has_target_role(user, target.pk, ENGINEER):
        raise Forbidden(f"Only an engineer of {target.name} can compare its revisions.")
    base = base or target.base_branch
    baseline_commit = _resolve(target, base, fetch=fetch)
    candidate_commit = _resolve(target, candidate, fetch=fetch)
    if candidate_commit == baseline_commit:
        raise DomainError(f"{candidate} and {base} are the same commit "
                          f"({candidate_commit[:10]}): there is nothing to compare.")
    with transaction.atomic():
        experiment = experiment_request(
            target=target, candidate_commit=candidate_commit, baseline_commit=baseline_commit,
            probes=probes, origin=f"compare {candidate} against {base}"[:200], send=send)
        if user is not None:
            audit_record(actor=user, action="experiment.compare", obj=experiment,
                         data={"candidate": candidate, "base": base})
    return experiment


def _resolve(target: Target, rev: str, *, fetch: bool = True) -> str:
    for attempt in range(2 if fetch else 1):
        for name in (rev, f"refs/remotes/origin/{rev}"):
            try:
                return gitops.rev_parse(target.clone_path, name)
            except gitops.GitError:
                continue
        if attempt == 0 and fetch:
            try:
                gitops.repo_fetch(target.clone_path)
            except gitops.GitError as exc:
                raise DomainError(f"{rev!r} is not in {target.name}'s clone and fetching "
                                  f"from upstream failed: {exc}") from None
    if not fetch:
        raise DomainError(f"{rev!r} names no commit of {target.name} as its clone was last "
                          "fetched: give a branch, tag or commit sha it has, or refresh the "
                          "target so that a worker fetches its upstream.")
    raise DomainError(f"{rev!r} names no commit of {target.name}, here or upstream: give a "
                      "branch, tag or commit sha.")


def _send_after_commit(experiment_id: int, queue: str) -> None:
    from infraops.tasks import experiment_execute  # tasks import services, not the reverse

    transaction.on_commit(lambda: experiment_execute.apply_async((experiment_id,), queue=queue))


def _holder_dead(claimed_by: str) -> bool:
    """True when the holder was a process on this host that no longer exists."""
    host, _, pid = claimed_by.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def experiment_claim(*, experiment_id: int, worker: str) -> Experiment | None:
    """Take the experiment for `worker` with a lease; None when someone else holds it, it is
    finished, or it ran out of attempts (then it is failed as poison)."""
    now = timezone.now()
    # The usual case in one statement: a queued experiment with attempts left. A duplicate
    # message's UPDATE waits for this row lock, then finds it running and takes the path below.
    claimed = Experiment.objects.filter(
        pk=experiment_id, status=Experiment.Status.QUEUED, attempts__lt=F("max_attempts"),
    ).update(
        status=Experiment.Status.RUNNING, attempts=F("attempts") + 1, claimed_by=worker,
        lease_expires_at=now + lease(),
        started_at=Coalesce("started_at", Value(now, output_field=DateTimeField())),
    )
    if claimed:
        experiment_changed(experiment_id)
        return Experiment.objects.select_related("target").get(pk=experiment_id)
    with transaction.atomic():
        experiment = (
            Experiment.objects.select_for_update(skip_locked=True, of=("self",))
            .select_related("target")
            .filter(Q(status=Experiment.Status.QUEUED) | Q(status=Experiment.Status.RUNNING),
                    pk=experiment_id)
            .first()
        )
        if experiment is None:
            return None
        if (experiment.status == Experiment.Status.RUNNING
                and experiment.lease_expires_at and experiment.lease_expires_at > now
                and not _holder_dead(experiment.claimed_by)):
            return None
        if experiment.attempts >= experiment.max_attempts:
            _fail(experiment.pk, f"gave up after {experiment.attempts} attempts: every attempt "
                                 "ended without a result (poison experiment)")
            return None
        # The row is locked: plain values are safe, and spare a re-read.
        experiment.status = Experiment.Status.RUNNING
        experiment.attempts += 1
        experiment.claimed_by = worker
        experiment.lease_expires_at = now + lease()
        experiment.started_at = experiment.started_at or now
        experiment.save(update_fields=["status", "attempts", "claimed_by", "lease_expires_at",
                                       "started_at"])
        experiment_changed(experiment.pk)
    return experiment


def experiment_cancel(*, experiment: Experiment, reason: str) -> bool:
    """Cancel `experiment` while it is still queued: it becomes CANCELLED with `reason` as its
    failure_reason and finished_at set, and the worker that later receives its task finds
    nothing to claim (experiment_claim takes only queued or running ones). True when it was
    cancelled; False when it had already been claimed or finished: a running experiment is
    left to run. `experiment` is refreshed when it was cancelled. Runs waiting for it wake
    (experiment_finished, after the commit)."""
    with transaction.atomic():
        cancelled = Experiment.objects.filter(
            pk=experiment.pk, status=Experiment.Status.QUEUED,
        ).update(status=Experiment.Status.CANCELLED, failure_reason=reason,
                 finished_at=timezone.now(), lease_expires_at=None)
        if cancelled:
            pk = experiment.pk
            transaction.on_commit(lambda: experiment_finished.send(Experiment, experiment_id=pk))
    if cancelled:
        experiment.refresh_from_db(fields=["status", "failure_reason", "finished_at",
                                           "lease_expires_at"])
    return bool(cancelled)


def experiment_give_up(*, experiment_id: int, worker: str, reason: str) -> bool:
    """Fail the experiment `worker` holds, with the reason; False when it no longer holds it."""
    with transaction.atomic():
        failed = Experiment.objects.filter(
            pk=experiment_id, claimed_by=worker, status=Experiment.Status.RUNNING
        ).update(status=Experiment.Status.FAILED, failure_reason=reason,
                 finished_at=timezone.now(), lease_expires_at=None)
        if failed:
            transaction.on_commit(
                lambda: experiment_finished.send(Experiment, experiment_id=experiment_id))
    return bool(failed)


def _fail(experiment_id: int, reason: str) -> None:
    """Fail an experiment whose every attempt ended without a result: lost."""
    Experiment.objects.filter(pk=experiment_id).update(
        status=Experiment.Status.FAILED, failure_reason=reason, finished_at=timezone.now(),
        lease_expires_at=None, lost=True,
    )
    transaction.on_commit(lambda: experiment_finished.send(Experiment, experiment_id=experiment_id))


class LeaseLost(Exception):
    """Another worker owns the experiment now: stop without writing anything more."""


@dataclass
class _Lease:
    experiment_id: int
    worker: str
    attempt: int
    lost: threading.Event = field(default_factory=threading.Event)

    def check(self) -> None:
        """Stop before starting more work once the heartbeat found the lease gone (cheap:
        no query; every write still renews under its own transaction)."""
        if self.lost.is_set():
            raise LeaseLost(f"experiment {self.experiment_id} attempt {self.attempt}")

    def renew(self) -> None:
        if self.lost.is_set():
            raise LeaseLost(f"experiment {self.experiment_id} attempt {self.attempt}")
        renewed = Experiment.objects.filter(
            pk=self.experiment_id, claimed_by=self.worker, attempts=self.attempt,
            status=Experiment.Status.RUNNING,
        ).update(lease_expires_at=timezone.now() + lease())
        if renewed != 1:
            self.lost.set()
            raise LeaseLost(f"experiment {self.experiment_id} attempt {self.attempt}")

    @contextlib.contextmanager
    def kept_alive(self) -> Iterator[None]:
        """Renew from a thread while a long probe runs, so the lease never lapses under it."""
        stop = threading.Event()

        def beat() -> None:
            try:
                while not stop.wait(renew_every()):
                    retried(self.renew, what=f"experiment {self.experiment_id} lease")
            except LeaseLost:
                pass
            finally:
                connection.close()  # this thread's own connection

        thread = threading.Thread(target=beat, name=f"lease-{self.experiment_id}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()


def experiment_execute(*, experiment_id: int, worker: str | None = None) -> Experiment | None:
    """Claim and run the experiment to the end; None when there was nothing to do."""
    worker = worker or worker_name()
    # A claim is one guarded statement or one transaction: safe to take again.
    experiment = retried(partial(experiment_claim, experiment_id=experiment_id, worker=worker),
                         what=f"experiment {experiment_id} claim")
    if experiment is None:
        return None
    lease = _Lease(experiment.pk, worker, experiment.attempts)
    workdir = Path(settings.DATA_DIR) / "work" / f"exp-{experiment.pk}-a{lease.attempt}"
    # A worker killed mid-attempt leaves its checkouts behind: this attempt removes them.
    for stale in workdir.parent.glob(f"exp-{experiment.pk}-a*"):
        if stale != workdir:
            _cleanup(stale)
    _tell_running(f"experiment {experiment.pk}")
    try:
        with lease.kept_alive():
            _run_probes(experiment, lease, workdir)
    except LeaseLost:
        log.warning("lost the lease on %s; another worker carries on", experiment)
        return None
    except WorkerNotAccepted as exc:
        # The web refused this worker (revoked, another release): not the experiment's fault.
        # It goes back to its queue for another worker, and this one stops taking tasks.
        log.error("experiment %s: %s; it goes back to the queue", experiment.pk, exc)
        experiment_release(experiment_id=experiment.pk, worker=worker, attempt=lease.attempt)
        _stop_this_worker()
        return None
    except sandbox.SandboxUnavailable as exc:
        _finish(lease, failure=str(exc), lost=True)  # this worker's fault, not the candidate's
    except (DomainError, gitops.GitError, ManifestError) as exc:
        _finish(lease, failure=str(exc))
    except SoftTimeLimitExceeded:
        raise  # the task fails it with the limit in words (infraops.tasks)
    except Exception as exc:
        # Anything else (a bug, a value a column refuses, a database error): the experiment
        # fails with the cause in words instead of staying running until the reaper calls it
        # poison with the cause only in this worker's log.
        log.exception("experiment %s attempt %s failed unexpectedly", experiment.pk,
                      lease.attempt)
        _fail_unexpectedly(lease, unexpected_reason(exc))
    finally:
        _tell_running("")
        _cleanup(workdir)
    retried(experiment.refresh_from_db, what=f"experiment {experiment.pk} read")
    return experiment


def _tell_running(what: str) -> None:
    """What this worker runs now, for its heartbeat to the web (remote workers only)."""
    if settings.WEB_URL:
        from infraops.experiments import remote

        try:
            remote.running_set(what)
        except OSError:
            log.warning("cannot record what this worker runs", exc_info=True)


def _stop_this_worker() -> None:
    """A warm shutdown of the worker this process belongs to: it takes no further task."""
    from celery import current_app

    name = os.environ.get("INFRAOPS_WORKER_NAME", "")
    if name:
        current_app.control.shutdown(destination=[name])


def experiment_release(*, experiment_id: int, worker: str, attempt: int) -> bool:
    """Give the experiment `worker` holds back to its queue (another worker takes it); False
    when it no longer holds it. The attempt stays counted: its rows are its own."""
    with transaction.atomic():
        released = Experiment.objects.filter(
            pk=experiment_id, claimed_by=worker, attempts=attempt,
            status=Experiment.Status.RUNNING,
        ).update(status=Experiment.Status.QUEUED, claimed_by="", lease_expires_at=None,
                 enqueued_at=timezone.now())
        if released:
            queue = Experiment.objects.values_list("queue", flat=True).get(pk=experiment_id)
            _send_after_commit(experiment_id, queue)
    if released:
        experiment_changed(experiment_id)
    return bool(released)


UNEXPECTED_MESSAGE_CHARS = 500


def unexpected_reason(exc: BaseException) -> str:
    """An unexpected error in words: its type, its message and where in our code it was
    raised (the innermost frame of the project's own files)."""
    message = " ".join(str(exc).split()) or "(no message)"
    if len(message) > UNEXPECTED_MESSAGE_CHARS:
        message = message[:UNEXPECTED_MESSAGE_CHARS] + "..."
    base = Path(settings.BASE_DIR).resolve()
    where = ""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        path = Path(frame.filename).resolve()
        if path.is_relative_to(base) and ".venv" not in path.relative_to(base).parts:
            where = f" (at {path.relative_to(base).as_posix()}:{frame.lineno} in {frame.name})"
            break
    return (f"unexpected error {type(exc).__name__}: {message}{where}; the worker's log has "
            "the traceback")


def _fail_unexpectedly(lease: _Lease, reason: str) -> None:
    """Fail the attempt with `reason`, as lost (Experiment.lost: a bug or the database, not
    the candidate): with its summary when the samples can still be read, else with the reason
    alone. Raises only when the database cannot record it (the lease then expires and the
    reaper retries the experiment)."""
    if (connection.errors_occurred and not connection.in_atomic_block
            and not connection.is_usable()):
        connection.close()  # a broken connection: the next query opens a new one
    try:
        _finish(lease, failure=reason, lost=True)
    except LeaseLost:
        return
    except Exception:
        log.exception("experiment %s: the summary of a failed attempt could not be made",
                      lease.experiment_id)
        with transaction.atomic():
            failed = Experiment.objects.filter(
                pk=lease.experiment_id, claimed_by=lease.worker, attempts=lease.attempt,
                status=Experiment.Status.RUNNING,
            ).update(status=Experiment.Status.FAILED, failure_reason=reason,
                     finished_at=timezone.now(), lease_expires_at=None, lost=True)
            if failed:
                transaction.on_commit(lambda: experiment_finished.send(
                    Experiment, experiment_id=lease.experiment_id))


@dataclass
class _Attempt:
    """One attempt's run: where its checkouts and outputs live, and what it recorded."""

    experiment: Experiment
    lease: _Lease
    workdir: Path
    identity: sandbox.SandboxIdentity
    trees: dict[str, Path]
    before_candidate: Callable[[], object]  # waits for the candidate's checkout
    samples: list[SampleRow] = field(default_factory=list)
    # (probe, side, variant key) that have run once: a compile cache's fill is behind them.
    filled: set[tuple[str, str, str]] = field(default_factory=set)
    # Per side, its compile cache's files as the last fill left them (cache_listing).
    cache_files: dict[str, dict[str, tuple[int, int]]] = field(default_factory=dict)


def _run_probes(experiment: Experiment, lease: _Lease, workdir: Path) -> None:
    problem = sandbox.sandbox_check()
    if problem is not None:
        raise sandbox.SandboxUnavailable(f"No sandbox on {lease.worker}: {problem}")
    repo = experiment_repository(experiment)
    # The manifest at the baseline (protected from agent edits) defines what runs and how.
    manifest = _baseline_manifest(experiment, repo)
    probes = select_probes(manifest, list(experiment.probes), [])
    trees = {str(side): workdir / side for side in SIDES}
    commits = {"baseline": experiment.baseline_commit, "candidate": experiment.candidate_commit}
    # One identity for the attempt's checkouts and runs: a uid of its own where the process
    # limit is per uid (infraops.experiments.sandbox.sandbox_identity_lease).
    with sandbox.sandbox_identity_lease(settings.SANDBOX_UID_POOL) as identity:

        def checkout(side: str) -> None:
            gitops.tree_export(repo, commits[side], trees[side])
            if any(probe.compile_cache for probe in probes):
                # A cache the commit holds would run binaries no one compiled from its source.
                shutil.rmtree(trees[side] / COMPILE_CACHE_FOLDER, ignore_errors=True)
            sandbox.sandbox_prepare_dir(trees[side], identity)

        def prepare_candidate() -> tuple[dict[str, str | None], dict[str, set[str]]]:
            # Git only, no database: while the baseline's first execution runs.
            checkout("candidate")
            committed = {side: set(gitops.list_files(repo, commits[side])) for side in commits}
            return _probe_file_ids(repo, experiment, probes), committed

        checkout("baseline")
        # The candidate's checkout overlaps the baseline's first run (ABBA starts with the
        # baseline).
        with ThreadPoolExecutor(max_workers=1) as pool:
            candidate_ready = pool.submit(prepare_candidate)
            attempt = _Attempt(experiment, lease, workdir, identity, trees,
                               before_candidate=candidate_ready.result)
            failures = _run_all(attempt, probes)
            ids, committed = candidate_ready.result()
    left = {side: left_behind(trees[side], committed[side],
                              filled=attempt.cache_files.get(side, {}))
            for side in commits}

    def analysed() -> dict[str, Any]:
        # It only reads (the attempt's executions, their labels and artifacts): a dropped
        # connection in it is read again, not an experiment lost to the database.
        executions = attempt_executions(experiment.pk, lease.attempt)
        return experiment_feedback(experiment, manifest, executions, attempt.samples,
                                   left_behind=left)

    _finish(lease, failure="; ".join(failures), rows=attempt.samples, probe_files=ids,
            feedback=retried(analysed, what=f"experiment {experiment.pk} analysis"))


LEFT_BEHIND_LIMIT = 20_000

# A probe's compile cache (its manifest's compile_cache = true): a folder of each side's work
# tree that the toolchains are pointed at (removed from the checkout first: a commit's own would
# run binaries no one compiled from its source). The probe's first execution of each side and
# variant in an attempt, never a sample and run under the second seed, fills it and its writes
# are kept; every later execution of the probe reads it, and what that execution writes to its
# work tree is thrown away (SandboxSpec.keep_workdir), so no sample leaves anything for the next.
# The samples' seed is drawn for the attempt, never the experiment's: a fill told it could
# compute their results ahead. The cache's files as the fills left them are not "left behind";
# anything else there is. A GPU probe's execution is mostly Triton compiling its kernels and
# torch starting (26-62 s an execution of the fla examples on an H200, a few milliseconds of
# them measured).
COMPILE_CACHE_FOLDER = ".infraops-cache"
_CACHE_INSIDE = f"/work/{COMPILE_CACHE_FOLDER}"
COMPILE_CACHE_ENV: Final = {
    "INFRAOPS_CACHE": _CACHE_INSIDE,
    "TRITON_CACHE_DIR": f"{_CACHE_INSIDE}/triton",
    "TORCHINDUCTOR_CACHE_DIR": f"{_CACHE_INSIDE}/inductor",
    "CUDA_CACHE_PATH": f"{_CACHE_INSIDE}/nv",
    "XDG_CACHE_HOME": f"{_CACHE_INSIDE}/xdg",
}


def left_behind(tree: Path, committed: set[str], *,
                filled: Mapping[str, tuple[int, int]] | None = None) -> list[str]:
    """Files in a side's checkout after its executions that its commit does not hold, bytecode
    caches excepted, and the files of its compile cache exactly as its fills left them
    (`filled`: cache_listing's after the last fill): what the probe (or the code under test)
    left for the next execution."""
    found: list[str] = []
    seen = 0
    for folder, dirs, files in os.walk(tree):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files:
            seen += 1
            if seen > LEFT_BEHIND_LIMIT:
                return sorted(found)
            path = Path(folder, name).relative_to(tree).as_posix()
            if (path not in committed and not name.endswith((".pyc", ".pyo"))
                    and not (filled and filled.get(path) == _size_and_time(tree / path))):
                found.append(path)
    return sorted(found)


def cache_listing(tree: Path) -> dict[str, tuple[int, int]]:
    """Every file of a side's compile cache (tree-relative path) with its size and mtime."""
    listing = {}
    for folder, _, files in os.walk(tree / COMPILE_CACHE_FOLDER):
        for name in files:
            path = Path(folder, name)
            listing[path.relative_to(tree).as_posix()] = _size_and_time(path)
    return listing


def _size_and_time(path: Path) -> tuple[int, int]:
    try:
        info = path.lstat()
    except OSError:
        return (-1, -1)
    return (info.st_size, info.st_mtime_ns)


def _run_all(attempt: _Attempt, probes: Sequence[Probe]) -> list[str]:
    failures: list[str] = []
    for probe in probes:
        failure = _run_probe(attempt, probe)
        if failure:
            failures.append(failure)
            if attempt.experiment.stop_on_failure:
                break  # a failing cheaper probe stops the costlier ones
    return failures


def experiment_repository(experiment: Experiment) -> Path:
    """Where this worker reads the experiment's commits: the target's clone when it shares
    the web's data folder, else its own cache of it, fetched over HTTP from the web
    (infraops.experiments.remote)."""
    if not settings.WEB_URL:
        return experiment.target.clone_path
    from infraops.experiments import remote

    fetch = remote.target_cache(experiment.target_id, [experiment.baseline_commit,
                                                       experiment.candidate_commit])
    log.info("experiment %s: %s commit(s) fetched into %s in %.2f s", experiment.pk,
             len(fetch.fetched), fetch.repo, fetch.seconds)
    return fetch.repo


def _baseline_manifest(experiment: Experiment, repo: Path) -> Manifest:
    """The manifest at the baseline (protected from agent edits): it defines what runs and
    how. The target's stored copy when the baseline is the commit it was read at."""
    return target_manifest_at(target=experiment.target, commit=experiment.baseline_commit,
                              repo=repo)


def _probe_file_ids(repo: Path, experiment: Experiment,
                    probes: Sequence[Probe]) -> dict[str, str | None]:
    """Git blob ids of every probe file at the baseline: which probe code produced the data."""
    paths = sorted({"infraops.toml"} | {f for p in probes for f in p.files})
    return gitops.blob_ids(repo, experiment.baseline_commit, paths)


def _run_probe(attempt: _Attempt, probe: Probe) -> str:
    """Run the variant cells of one probe the experiment chose (every cell unless its
    `variants` names the probe): its warm-ups (when it asks for them), then its repeats
    (_run_repeats). Returns a failure sentence, or '' when every execution exited 0.

    Warm-ups are never samples; they run under a second seed, so their outputs also tell
    whether the outputs follow the input (the integrity check of
    infraops/experiments/analysis.py). Without warm-ups (the default: a first-run outlier is
    found in the samples themselves) that second-seed execution runs after the samples, when
    the probe writes outputs.
    """
    try:
        access = probe_access(probe)
    except DomainError as exc:
        return f"probe {probe.name} could not run: {exc}"
    rng = random.SystemRandom()
    seed = attempt.experiment.seed
    if seed is None or probe.compile_cache:
        # A compile cache's fill runs code of the candidate before the samples, unmeasured, and
        # keeps what it writes: told the samples' seed (an agent run's is known), it could
        # compute their results ahead. So their seed is drawn here, unknown to every fill.
        seed = rng.randrange(2**31)
    check_seed = (seed + 1 + rng.randrange(2**31 - 1)) % 2**31  # never equal to seed
    for variant in attempt.experiment.variant_cells(probe):
        key = variant_key(variant)
        if probe.compile_cache and probe.warmup == 0:
            # Each side's compile cache is filled by an execution that is never a sample, under
            # the second seed: the check that outputs follow the input, moved to the front.
            failure = _run_slot(attempt, probe, access, variant, _Slot(-1, check_seed),
                                flip=False)
            if failure:
                return failure
        for index in range(probe.warmup, 0, -1):  # baseline first
            failure = _run_slot(attempt, probe, access, variant, _Slot(-index, check_seed),
                                flip=False)
            if failure:
                return failure
        failure, ran = _run_repeats(attempt, probe, access, variant, seed)
        if failure:
            return failure
        if probe.warmup == 0 and not probe.compile_cache and _wrote_outputs(attempt, probe, key):
            failure = _run_slot(attempt, probe, access, variant, _Slot(-1, check_seed),
                                flip=ran % 2 == 1)
            if failure:
                return failure
    return ""


def _run_repeats(attempt: _Attempt, probe: Probe, access: ProbeAccess, variant: dict[str, str],
                 seed: int) -> tuple[str, int]:
    """One variant's repeats, sides interleaved ABBA (the side that runs first alternates):
    the first look's (the probe's `repeat`), one more when a side's first execution is a
    first-run outlier (it is left out of the comparison), then each further look's
    (`extra_repeats`, in stages) while a comparison is inconclusive and the data say more
    repeats would decide it (analysis.look_state; feedback.stats.sequential_compare).
    Returns (a failure sentence or '', the repeats run)."""
    plan = sample_plan(probe)
    key = variant_key(variant)
    ran, look, replaced = 0, 0, False
    while True:
        while ran < plan[look] + int(replaced):
            failure = _run_slot(attempt, probe, access, variant, _Slot(ran, seed),
                                flip=ran % 2 == 1)
            if failure:
                return failure, ran
            ran += 1
        state = look_state(attempt.experiment, probe, key, attempt.samples)
        if state.first_run_outlier and not replaced:
            replaced = True
        elif state.more_would_decide and look + 1 < len(plan):
            look += 1
        else:
            return "", ran


@dataclass(frozen=True)
class _Slot:
    repeat: int  # negative: a warm-up (or the second-seed check), never a sample
    seed: int


def _out_dir(attempt: _Attempt, probe: Probe, side: str, key: str, repeat: int) -> Path:
    return attempt.workdir / "out" / f"{probe.name}-{side}-{key}-{repeat}"


def _wrote_outputs(attempt: _Attempt, probe: Probe, key: str) -> bool:
    outputs = _out_dir(attempt, probe, "baseline", key, 0) / "outputs"
    return outputs.is_dir() and not outputs.is_symlink() and any(outputs.iterdir())


def execution_label(probe: str, side: str, variant: str, repeat: int) -> str:
    which = "warm-up" if repeat < 0 else f"#{repeat}"
    return f"{probe} {side} [{variant or 'default'}] {which}"


def _run_slot(attempt: _Attempt, probe: Probe, access: ProbeAccess, variant: dict[str, str],
              slot: _Slot, *, flip: bool) -> str:
    """Both sides of one slot, baseline first unless `flip`."""
    key = variant_key(variant)
    limits = dataclasses.replace(probe_sandbox_limits(probe),
                                 address_space_mb=access.address_space_mb)
    sides = list(attempt.trees.items())
    for side, tree in (sides[::-1] if flip else sides):
        if side == "candidate":
            attempt.before_candidate()  # its checkout is ready (or raises its error)
        attempt.lease.check()
        out = _out_dir(attempt, probe, side, key, slot.repeat)
        out.mkdir(parents=True)
        sandbox.sandbox_prepare_dir(out, attempt.identity)
        label = execution_label(probe.name, side, key, slot.repeat)
        stream = LogStream(attempt.experiment.pk, label)
        env = {"PATH": access.path, **dict(access.environment),
               **probe_environment(variant, seed=slot.seed, repeat=slot.repeat),
               **(COMPILE_CACHE_ENV if probe.compile_cache else {})}
        fills = (probe.name, side, key) not in attempt.filled
        attempt.filled.add((probe.name, side, key))
        try:
            result = sandbox.sandbox_run(
                sandbox.SandboxSpec(
                    command=measured_command(probe), workdir=tree, out_dir=out, env=env,
                    limits=limits, devices=access.devices, readonly_binds=access.readonly_binds,
                    keep_workdir=fills or not probe.compile_cache,
                ),
                identity=attempt.identity, on_output=stream,
            )
        finally:
            stream.close()
        if probe.compile_cache and fills:
            attempt.cache_files[side] = cache_listing(tree)
        attempt.samples += _record(attempt, probe.name, side, key, slot, result, out,
                                   metrics_expected=bool(probe.metrics))
        if result.reason != "ok":
            return f"probe {label} failed: {result.detail}"
    return ""


def probe_sandbox_limits(probe: Probe) -> sandbox.SandboxLimits:
    """The sandbox limits of one execution of `probe`: its timeout, and the processes,
    memory_mb and disk_mb it asks for (the manifest keys, where the manifest has them) within
    the operator's maxima (settings.SANDBOX_MAX_*), and the host's inode limit. DomainError for
    a value over a maximum."""
    maxima = sandbox.SandboxMaxima(
        processes=settings.SANDBOX_MAX_PROCESSES, memory_mb=settings.SANDBOX_MAX_MEMORY_MB,
        disk_mb=settings.SANDBOX_MAX_DISK_MB, inodes=settings.SANDBOX_MAX_INODES)
    try:
        return sandbox.probe_limits(
            wall_seconds=probe.timeout, maxima=maxima,
            processes=probe.processes, memory_mb=probe.memory_mb, disk_mb=probe.disk_mb)
    except ValueError as exc:
        raise DomainError(f"Probe {probe.name!r}: {exc}.") from None


def probe_environment(variant: dict[str, str], *, seed: int, repeat: int) -> dict[str, str]:
    """What a probe execution is told (docs/feedback-contract.md, "What a probe sees")."""
    # A warm-up is told nothing that sets it apart (INFRAOPS_REPEAT is 0, as for the first
    # sample): code under test that could tell would behave differently when measured.
    return {k.upper(): v for k, v in variant.items()} | {
        "INFRAOPS_SEED": str(seed), "INFRAOPS_REPEAT": str(max(repeat, 0)),
    }


def reproduce_command(probe: Probe, execution: ProbeExecution, commit: str) -> str:
    """A shell line that reruns one execution outside InfraOps, in a checkout of `commit`."""
    variant = dict(part.split("=", 1) for part in execution.variant.split(",") if "=" in part)
    env = probe_environment(variant, seed=execution.seed or 0, repeat=execution.repeat_index)
    assignments = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()))
    return (f"git checkout {commit[:12]} && INFRAOPS_OUT=$(mktemp -d) {assignments} "
            f"sh -c {shlex.quote(probe.command)}")


CALLGRIND_PREFIX = "callgrind."


def measured_command(probe: Probe) -> str:
    """The probe's command, under callgrind when it asks for instruction counts: wall time on
    shared machines varies by 16-29%, instruction counts by 0.03% (docs/product.md, "Stack")."""
    if probe.measure != "instructions":
        return probe.command
    output = f"/out/{CALLGRIND_PREFIX}%p.out"
    return (f"valgrind --tool=callgrind --trace-children=yes --quiet "
            f"--callgrind-out-file={output} /bin/sh -c {shlex.quote(probe.command)}")


def _record(
    attempt: _Attempt, probe: str, side: str, variant: str, slot: _Slot,
    result: sandbox.SandboxResult, out: Path, *, metrics_expected: bool = True,
) -> list[SampleRow]:
    """Store one execution with its samples and artifacts; returns the samples stored. A
    warm-up's metrics are read (a malformed file is still named) but never stored as samples."""
    experiment, lease = attempt.experiment, attempt.lease
    repeat = slot.repeat
    rows, problems = read_metrics(out / "metrics.jsonl")
    if not metrics_expected and not (out / "metrics.jsonl").exists():
        problems = []  # a correctness probe may report no metrics (its verdict is outputs/)
    rows += instruction_rows(out)
    if repeat < 0:
        rows = []
    artifacts, more = artifacts_collect(out)  # files first, outside the transaction

    def store() -> int | None:
        """The execution's id; None when this attempt recorded it already (a retry after
        the commit went through and its answer was lost: the unique key says so)."""
        try:
            return _record_execution(attempt, probe, side, variant, slot, result, rows,
                                     artifacts, [*problems, *more])
        except IntegrityError:
            # The unique constraint, one result per attempt (the whole transaction rolled
            # back; no savepoint, which cost two round trips a run).
            if ProbeExecution.objects.filter(
                    experiment=experiment, attempt=lease.attempt, probe=probe, side=side,
                    variant=variant, repeat_index=repeat).exists():
                return None
            raise

    execution_id = retried(store, what=f"experiment {experiment.pk} record")
    if execution_id is None:
        return []
    return [SampleRow(execution=execution_id, probe=probe, side=side, variant=variant,
                      metric=row["name"], value=row["value"], unit=row["unit"], case=row["case"])
            for row in rows]


def _record_execution(
    attempt: _Attempt, probe: str, side: str, variant: str, slot: _Slot,
    result: sandbox.SandboxResult, rows: list[MetricRow], artifacts: list[Artifact],
    problems: list[str],
) -> int:
    """One transaction: the execution, its samples and its artifacts; returns its id."""
    experiment, lease, repeat = attempt.experiment, attempt.lease, slot.repeat
    with transaction.atomic():
        lease.renew()  # locks the row: nobody else writes for this attempt meanwhile
        execution = ProbeExecution.objects.create(
            experiment=experiment, attempt=lease.attempt, probe=probe, side=side,
            variant=variant, repeat_index=repeat, seed=slot.seed,
            exit_code=result.exit_code,
            reason=result.reason, wall_seconds=result.wall_seconds,
            detail="\n".join([result.detail, *problems]).strip(),
            stdout=printable(result.stdout[-KEPT_OUTPUT_BYTES:]),
            stderr=printable(result.stderr[-KEPT_OUTPUT_BYTES:]),
        )
        samples_copy(execution, rows)
        artifacts_link(execution, artifacts)
    return execution.pk


def _finish(lease: _Lease, *, failure: str, feedback: dict[str, Any] | None = None,
            rows: Sequence[SampleRow] | None = None,
            probe_files: dict[str, str | None] | None = None, lost: bool = False) -> None:
    """End the attempt with its summary (from rows, the attempt's samples, read when None)."""
    if rows is None:
        rows = attempt_samples(attempt_executions(lease.experiment_id, lease.attempt))
    summary = {"attempt": lease.attempt,
               "comparisons": [c.as_dict() for c in compare_samples(per_execution_rows(rows))]}
    # One statement, committed when it returns; guarded, so a retry after a lost answer
    # finds nothing to do.
    finished = retried(lambda: Experiment.objects.filter(
        pk=lease.experiment_id, claimed_by=lease.worker, attempts=lease.attempt,
        status=Experiment.Status.RUNNING,
    ).update(
        status=(Experiment.Status.FAILED if failure else Experiment.Status.SUCCEEDED),
        failure_reason=failure, summary=summary, feedback=feedback or {},
        finished_at=timezone.now(), lease_expires_at=None, lost=lost,
        **({} if probe_files is None else {"probe_files": probe_files}),
    ), what=f"experiment {lease.experiment_id} finish")
    if finished == 1:  # after the commit (at once outside a transaction)
        # Its receivers only wake what waits on the experiment (agents.receivers): safe to
        # send again when a dropped connection failed them.
        transaction.on_commit(lambda: retried(
            lambda: experiment_finished.send(Experiment, experiment_id=lease.experiment_id),
            what=f"experiment {lease.experiment_id} finished signal"))


def _cleanup(workdir: Path) -> None:
    """Delete an attempt's checkouts and outputs (plain folders: see gitops.tree_export)."""
    shutil.rmtree(workdir, ignore_errors=True)


def experiments_reap() -> list[int]:
    """Re-send experiments whose lease expired (their worker died) and experiments queued so
    long that their message was probably lost with a killed worker. Duplicates are harmless:
    a claim lets only one through. Returns the ids re-sent."""
    now = timezone.now()
    stale = Experiment.objects.filter(
        Q(status=Experiment.Status.RUNNING, lease_expires_at__lt=now)
        | Q(status=Experiment.Status.QUEUED, enqueued_at__lt=now - REQUEUE_QUEUED_AFTER)
    )
    resent = []
    with transaction.atomic():
        for pk, queue in stale.select_for_update(skip_locked=True).values_list("pk", "queue"):
            Experiment.objects.filter(pk=pk).update(enqueued_at=now)
            _send_after_commit(pk, queue)
            resent.append(pk)
    return resent
