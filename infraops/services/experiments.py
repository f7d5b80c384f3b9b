"""Experiments: request, claim with a lease, execute probes sandboxed, analyse, reap.

Safe to run twice: an execution is owned by (claimed_by, attempt) and every write checks it;
results are unique per attempt, so a re-delivered task never records a result twice.

Leases: a claim holds the experiment for LEASE; a heartbeat thread renews it while probes run.
A task redelivered on the same host after its worker process died takes over at once (the
holder's pid is gone); elsewhere the reaper re-queues it once the lease has expired.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import shlex
import shutil
import socket
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import DateTimeField, F, Q, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from infraops import gitops, sandbox
from infraops.analysis import SampleRow, compare_samples
from infraops.errors import DomainError
from infraops.manifest import Manifest, ManifestError, Probe, parse_manifest
from infraops.models import Experiment, ProbeExecution, Target, variant_key
from infraops.services.analysis import attempt_executions, attempt_samples, experiment_feedback
from infraops.services.results import (
    LogStream,
    artifacts_collect,
    artifacts_link,
    instruction_rows,
    printable,
    read_metrics,
    samples_copy,
)
from infraops.signals import experiment_finished

log = logging.getLogger(__name__)

LEASE = timedelta(seconds=60)
RENEW_EVERY = 15.0
REQUEUE_QUEUED_AFTER = timedelta(minutes=2)
KEPT_OUTPUT_BYTES = 64_000
SIDES = (ProbeExecution.Side.BASELINE, ProbeExecution.Side.CANDIDATE)


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


def experiment_request(
    *, target: Target, candidate_commit: str, baseline_commit: str,
    probes: Sequence[str] = (), origin: str = "", stop_on_failure: bool = True,
    criteria: Sequence[dict[str, Any]] = (),
) -> Experiment:
    """Queue an experiment; its task is sent after commit, to the queue its probes need."""
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
    experiment = Experiment.objects.create(
        target=target, candidate_commit=candidate_commit, baseline_commit=baseline_commit,
        probes=[p.name for p in chosen], changed_paths=changed[:1000], queue=queue_for(chosen),
        origin=origin, manifest_sha256=target.manifest_sha256, stop_on_failure=stop_on_failure,
        enqueued_at=timezone.now(), criteria=list(criteria),
    )
    _send_after_commit(experiment.pk, experiment.queue)
    return experiment


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
        lease_expires_at=now + LEASE,
        started_at=Coalesce("started_at", Value(now, output_field=DateTimeField())),
    )
    if claimed:
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
        experiment.lease_expires_at = now + LEASE
        experiment.started_at = experiment.started_at or now
        experiment.save(update_fields=["status", "attempts", "claimed_by", "lease_expires_at",
                                       "started_at"])
    return experiment


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
    Experiment.objects.filter(pk=experiment_id).update(
        status=Experiment.Status.FAILED, failure_reason=reason, finished_at=timezone.now(),
        lease_expires_at=None,
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
        ).update(lease_expires_at=timezone.now() + LEASE)
        if renewed != 1:
            self.lost.set()
            raise LeaseLost(f"experiment {self.experiment_id} attempt {self.attempt}")

    @contextlib.contextmanager
    def kept_alive(self) -> Iterator[None]:
        """Renew from a thread while a long probe runs, so the lease never lapses under it."""
        stop = threading.Event()

        def beat() -> None:
            try:
                while not stop.wait(RENEW_EVERY):
                    self.renew()
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
    experiment = experiment_claim(experiment_id=experiment_id, worker=worker)
    if experiment is None:
        return None
    lease = _Lease(experiment.pk, worker, experiment.attempts)
    workdir = Path(settings.DATA_DIR) / "work" / f"exp-{experiment.pk}-a{lease.attempt}"
    # A worker killed mid-attempt leaves its checkouts behind: this attempt removes them.
    for stale in workdir.parent.glob(f"exp-{experiment.pk}-a*"):
        if stale != workdir:
            _cleanup(stale)
    try:
        with lease.kept_alive():
            _run_probes(experiment, lease, workdir)
    except LeaseLost:
        log.warning("lost the lease on %s; another worker carries on", experiment)
        return None
    except (DomainError, sandbox.SandboxUnavailable, gitops.GitError, ManifestError) as exc:
        _finish(lease, failure=str(exc))
    finally:
        _cleanup(workdir)
    experiment.refresh_from_db()
    return experiment


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


def _run_probes(experiment: Experiment, lease: _Lease, workdir: Path) -> None:
    problem = sandbox.sandbox_check()
    if problem is not None:
        raise sandbox.SandboxUnavailable(f"No sandbox on {lease.worker}: {problem}")
    repo = experiment.target.clone_path
    # The manifest at the baseline (protected from agent edits) defines what runs and how.
    manifest = _baseline_manifest(experiment)
    probes = select_probes(manifest, list(experiment.probes), [])
    identity = sandbox.sandbox_identity()
    trees = {str(side): workdir / side for side in SIDES}
    commits = {"baseline": experiment.baseline_commit, "candidate": experiment.candidate_commit}

    def checkout(side: str) -> None:
        gitops.tree_export(repo, commits[side], trees[side])
        sandbox.sandbox_prepare_dir(trees[side], identity)

    def prepare_candidate() -> dict[str, str | None]:
        checkout("candidate")
        return _probe_file_ids(experiment, probes)  # git only: no database on this thread

    checkout("baseline")
    # The candidate's checkout overlaps the baseline's first run (ABBA starts with the
    # baseline).
    with ThreadPoolExecutor(max_workers=1) as pool:
        candidate_ready = pool.submit(prepare_candidate)
        attempt = _Attempt(experiment, lease, workdir, identity, trees,
                           before_candidate=candidate_ready.result)
        failures = _run_all(attempt, probes)
        ids = candidate_ready.result()
    executions = attempt_executions(experiment.pk, lease.attempt)
    _finish(lease, failure="; ".join(failures), rows=attempt.samples, probe_files=ids,
            feedback=experiment_feedback(experiment, manifest, executions, attempt.samples))


def _run_all(attempt: _Attempt, probes: Sequence[Probe]) -> list[str]:
    failures: list[str] = []
    for probe in probes:
        failure = _run_probe(attempt, probe)
        if failure:
            failures.append(failure)
            if attempt.experiment.stop_on_failure:
                break  # a failing cheaper probe stops the costlier ones
    return failures


def _baseline_manifest(experiment: Experiment) -> Manifest:
    """The manifest at the baseline (protected from agent edits): it defines what runs and
    how. The target's stored copy when the baseline is the commit it was read at."""
    target = experiment.target
    if experiment.baseline_commit == target.manifest_commit and target.manifest_text:
        return parse_manifest(target.manifest_text)
    raw = gitops.read_file(target.clone_path, experiment.baseline_commit, "infraops.toml")
    if raw is None:
        raise DomainError("infraops.toml is missing at the baseline revision.")
    return parse_manifest(raw.decode("utf-8", "replace"))


def _probe_file_ids(experiment: Experiment, probes: Sequence[Probe]) -> dict[str, str | None]:
    """Git blob ids of every probe file at the baseline: which probe code produced the data."""
    paths = sorted({"infraops.toml"} | {f for p in probes for f in p.files})
    return gitops.blob_ids(experiment.target.clone_path, experiment.baseline_commit, paths)


def _run_probe(attempt: _Attempt, probe: Probe) -> str:
    """Run every variant and repeat of one probe, sides interleaved ABBA (the first side
    alternates per repeat). Returns a failure
    sentence, or '' when every execution exited 0."""
    seed = random.SystemRandom().randrange(2**31)
    for variant in probe.variant_matrix():
        key = variant_key(variant)
        for repeat in range(probe.repeat):
            # ABBA: the side that runs first alternates, so an order effect cancels out.
            sides = list(attempt.trees.items())
            order = sides if repeat % 2 == 0 else sides[::-1]
            for side, tree in order:
                if side == "candidate":
                    attempt.before_candidate()  # its checkout is ready (or raises its error)
                attempt.lease.check()
                out = attempt.workdir / "out" / f"{probe.name}-{side}-{key}-{repeat}"
                out.mkdir(parents=True)
                sandbox.sandbox_prepare_dir(out, attempt.identity)
                label = f"{probe.name} {side} [{key or 'default'}] #{repeat}"
                stream = LogStream(attempt.experiment.pk, label)
                env = {k.upper(): v for k, v in variant.items()} | {
                    "INFRAOPS_SEED": str(seed), "INFRAOPS_REPEAT": str(repeat),
                }
                try:
                    result = sandbox.sandbox_run(
                        sandbox.SandboxSpec(
                            command=measured_command(probe), workdir=tree, out_dir=out, env=env,
                            limits=sandbox.SandboxLimits(wall_seconds=probe.timeout),
                        ),
                        identity=attempt.identity, on_output=stream,
                    )
                finally:
                    stream.close()
                attempt.samples += _record(attempt, probe.name, side, key, repeat, result, out)
                if result.reason != "ok":
                    return f"probe {label} failed: {result.detail}"
    return ""


CALLGRIND_PREFIX = "callgrind."


def measured_command(probe: Probe) -> str:
    """The probe's command, under callgrind when it asks for instruction counts: wall time on
    shared machines varies by 16-29%, instruction counts by 0.03% (ARCHITECTURE.md)."""
    if probe.measure != "instructions":
        return probe.command
    output = f"/out/{CALLGRIND_PREFIX}%p.out"
    return (f"valgrind --tool=callgrind --trace-children=yes --quiet "
            f"--callgrind-out-file={output} /bin/sh -c {shlex.quote(probe.command)}")


def _record(
    attempt: _Attempt, probe: str, side: str, variant: str, repeat: int,
    result: sandbox.SandboxResult, out: Path,
) -> list[SampleRow]:
    """Store one execution with its samples and artifacts; returns the samples stored."""
    experiment, lease = attempt.experiment, attempt.lease
    rows, problems = read_metrics(out / "metrics.jsonl")
    rows += instruction_rows(out)
    artifacts, more = artifacts_collect(out)  # files first, outside the transaction
    try:
        with transaction.atomic():
            lease.renew()  # locks the row: nobody else writes for this attempt meanwhile
            execution = ProbeExecution.objects.create(
                experiment=experiment, attempt=lease.attempt, probe=probe, side=side,
                variant=variant, repeat_index=repeat, exit_code=result.exit_code,
                reason=result.reason, wall_seconds=result.wall_seconds,
                detail="\n".join([result.detail, *problems, *more]).strip(),
                stdout=printable(result.stdout[-KEPT_OUTPUT_BYTES:]),
                stderr=printable(result.stderr[-KEPT_OUTPUT_BYTES:]),
            )
            samples_copy(execution, rows)
            artifacts_link(execution, artifacts)
    except IntegrityError:
        # The unique constraint, one result per attempt: this one is recorded already (the
        # whole transaction rolled back; no savepoint, which cost two round trips a run).
        if ProbeExecution.objects.filter(
                experiment=experiment, attempt=lease.attempt, probe=probe, side=side,
                variant=variant, repeat_index=repeat).exists():
            return []
        raise
    return [SampleRow(execution=execution.pk, probe=probe, side=side, variant=variant,
                      metric=row["name"], value=row["value"], unit=row["unit"], case=row["case"])
            for row in rows]


def _finish(lease: _Lease, *, failure: str, feedback: dict[str, Any] | None = None,
            rows: Sequence[SampleRow] | None = None,
            probe_files: dict[str, str | None] | None = None) -> None:
    """End the attempt with its summary (from rows, the attempt's samples, read when None)."""
    if rows is None:
        rows = attempt_samples(attempt_executions(lease.experiment_id, lease.attempt))
    summary = {"attempt": lease.attempt,
               "comparisons": [c.as_dict() for c in compare_samples(rows)]}
    finished = Experiment.objects.filter(  # one statement: committed when it returns
        pk=lease.experiment_id, claimed_by=lease.worker, attempts=lease.attempt,
        status=Experiment.Status.RUNNING,
    ).update(
        status=(Experiment.Status.FAILED if failure else Experiment.Status.SUCCEEDED),
        failure_reason=failure, summary=summary, feedback=feedback or {},
        finished_at=timezone.now(), lease_expires_at=None,
        **({} if probe_files is None else {"probe_files": probe_files}),
    )
    if finished == 1:  # after the commit (at once outside a transaction)
        transaction.on_commit(
            lambda: experiment_finished.send(Experiment, experiment_id=lease.experiment_id))


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
