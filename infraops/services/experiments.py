"""Experiments: request, claim with a lease, execute probes sandboxed, store, analyse, reap.

Safe to run twice: an execution is owned by (claimed_by, attempt) and every write checks it;
results are unique per attempt, so a re-delivered task never records a result twice.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import shutil
import socket
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, TypedDict

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from infraops import gitops, sandbox
from infraops.analysis import SampleRow, compare_samples
from infraops.errors import DomainError
from infraops.manifest import Manifest, ManifestError, Probe, parse_manifest
from infraops.models import Experiment, ProbeExecution, Sample, Target, variant_key
from infraops.signals import experiment_finished

log = logging.getLogger(__name__)

LEASE = timedelta(minutes=5)
KEPT_OUTPUT_BYTES = 64_000


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def queue_for(probes: list[Probe]) -> str:
    """experiments, or experiments.<req>[.<req>] for probes that need hardware."""
    needs = sorted({req for probe in probes for req in probe.requires})
    return "experiments" + "".join(f".{req}" for req in needs)


def experiment_request(
    *, target: Target, candidate_commit: str, baseline_commit: str,
    probes: list[str] | None = None, origin: str = "",
) -> Experiment:
    """Queue an experiment; its task is sent after commit, to the queue its probes need."""
    manifest = target.manifest()
    if manifest is None:
        raise DomainError(f"{target.name} has no valid infraops.toml: fix it before experimenting.")
    chosen = _select_probes(manifest, probes or [])
    experiment = Experiment.objects.create(
        target=target, candidate_commit=candidate_commit, baseline_commit=baseline_commit,
        probes=[p.name for p in chosen], queue=queue_for(chosen), origin=origin,
        manifest_sha256=target.manifest_sha256,
    )
    from infraops.tasks import experiment_execute  # tasks import services, not the reverse

    transaction.on_commit(
        lambda: experiment_execute.apply_async((experiment.pk,), queue=experiment.queue)
    )
    return experiment


def _select_probes(manifest: Manifest, names: list[str]) -> list[Probe]:
    if not names:
        return sorted(manifest.probes, key=lambda p: p.cost)
    unknown = [n for n in names if manifest.probe(n) is None]
    if unknown:
        raise DomainError(f"Unknown probe(s): {', '.join(unknown)}.")
    return sorted((p for p in manifest.probes if p.name in names), key=lambda p: p.cost)


def experiment_claim(*, experiment_id: int, worker: str) -> Experiment | None:
    """Take the experiment for `worker` with a lease; None when someone else holds it, it is
    finished, or it ran out of attempts (then it is failed as poison)."""
    now = timezone.now()
    claimable = Q(status=Experiment.Status.QUEUED) | Q(
        status=Experiment.Status.RUNNING, lease_expires_at__lt=now
    )
    with transaction.atomic():
        experiment = (
            Experiment.objects.select_for_update(skip_locked=True)
            .filter(claimable, pk=experiment_id)
            .first()
        )
        if experiment is None:
            return None
        if experiment.attempts >= experiment.max_attempts:
            _fail(experiment, f"gave up after {experiment.attempts} attempts (poison experiment)")
            return None
        experiment.status = Experiment.Status.RUNNING
        experiment.attempts = F("attempts") + 1
        experiment.claimed_by = worker
        experiment.lease_expires_at = now + LEASE
        experiment.started_at = experiment.started_at or now
        experiment.save(update_fields=[
            "status", "attempts", "claimed_by", "lease_expires_at", "started_at",
        ])
        experiment.refresh_from_db()
    return experiment


def _fail(experiment: Experiment, reason: str) -> None:
    Experiment.objects.filter(pk=experiment.pk).update(
        status=Experiment.Status.FAILED, failure_reason=reason, finished_at=timezone.now(),
        lease_expires_at=None,
    )
    transaction.on_commit(lambda: experiment_finished.send(Experiment, experiment_id=experiment.pk))


class LeaseLost(Exception):
    """Another worker owns the experiment now: stop without writing anything more."""


@dataclass
class _Lease:
    experiment_id: int
    worker: str
    attempt: int

    def renew(self) -> None:
        renewed = Experiment.objects.filter(
            pk=self.experiment_id, claimed_by=self.worker, attempts=self.attempt,
            status=Experiment.Status.RUNNING,
        ).update(lease_expires_at=timezone.now() + LEASE)
        if renewed != 1:
            raise LeaseLost(f"experiment {self.experiment_id} attempt {self.attempt}")


def experiment_execute(*, experiment_id: int, worker: str | None = None) -> Experiment | None:
    """Claim and run the experiment to the end; None when there was nothing to do."""
    worker = worker or worker_name()
    experiment = experiment_claim(experiment_id=experiment_id, worker=worker)
    if experiment is None:
        return None
    lease = _Lease(experiment.pk, worker, experiment.attempts)
    workdir = Path(settings.DATA_DIR) / "work" / f"exp-{experiment.pk}-a{lease.attempt}"
    try:
        _run_probes(experiment, lease, workdir)
    except LeaseLost:
        log.warning("lost the lease on %s; another worker carries on", experiment)
        return None
    except (DomainError, sandbox.SandboxUnavailable, gitops.GitError, ManifestError) as exc:
        _finish(lease, failure=str(exc))
    finally:
        _cleanup(experiment.target, workdir)
    experiment.refresh_from_db()
    return experiment


def _run_probes(experiment: Experiment, lease: _Lease, workdir: Path) -> None:
    problem = sandbox.sandbox_check()
    if problem is not None:
        raise sandbox.SandboxUnavailable(f"No sandbox on {lease.worker}: {problem}")
    target = experiment.target
    repo = target.clone_path
    raw = gitops.read_file(repo, experiment.candidate_commit, "infraops.toml")
    if raw is None:
        raise DomainError("infraops.toml is missing at the candidate revision.")
    # The manifest at the baseline (protected from agent edits) defines what runs.
    base_raw = gitops.read_file(repo, experiment.baseline_commit, "infraops.toml") or raw
    manifest = parse_manifest(base_raw.decode())
    probes = _select_probes(manifest, list(experiment.probes))
    trees: dict[str, Path] = {
        str(side): workdir / side
        for side in (ProbeExecution.Side.BASELINE, ProbeExecution.Side.CANDIDATE)
    }
    identity = sandbox.sandbox_identity()
    for side, path in trees.items():
        commit = (experiment.baseline_commit if side == ProbeExecution.Side.BASELINE
                  else experiment.candidate_commit)
        gitops.worktree_add(repo, path, commit)
        sandbox.sandbox_prepare_dir(path, identity)
    failures: list[str] = []
    for probe in probes:
        failure = _run_probe(experiment, lease, probe, trees, workdir, identity)
        if failure:
            failures.append(failure)
            break  # a failing cheaper probe stops the costlier ones
    _finish(lease, failure="; ".join(failures))


def _run_probe(
    experiment: Experiment, lease: _Lease, probe: Probe, trees: dict[str, Path], workdir: Path,
    identity: sandbox.SandboxIdentity,
) -> str:
    """Run every variant and repeat of one probe, sides interleaved (ABAB...). Returns a failure
    sentence, or '' when every execution exited 0."""
    seed = random.SystemRandom().randrange(2**31)
    for variant in probe.variant_matrix():
        for repeat in range(probe.repeat):
            for side, tree in trees.items():
                lease.renew()
                out = workdir / "out" / f"{probe.name}-{side}-{variant_key(variant)}-{repeat}"
                out.mkdir(parents=True)
                sandbox.sandbox_prepare_dir(out, identity)
                env = {key.upper(): value for key, value in variant.items()} | {
                    "INFRAOPS_SEED": str(seed), "INFRAOPS_REPEAT": str(repeat),
                }
                result = sandbox.sandbox_run(
                    sandbox.SandboxSpec(
                        command=probe.command, workdir=tree, out_dir=out, env=env,
                        readonly_binds=[(tree / ".git", "/work/.git")],
                        limits=sandbox.SandboxLimits(wall_seconds=probe.timeout),
                    ),
                    identity=identity,
                )
                _record(experiment, lease, probe, side, variant, repeat, result, out)
                if result.reason != "ok":
                    return (f"probe {probe.name} ({side}, {variant_key(variant) or 'default'}) "
                            f"failed: {result.detail}")
    return ""


def _record(
    experiment: Experiment, lease: _Lease, probe: Probe, side: str, variant: dict[str, str],
    repeat: int, result: sandbox.SandboxResult, out: Path,
) -> None:
    key = variant_key(variant)
    samples, problems = read_metrics(out / "metrics.jsonl")
    with transaction.atomic():
        lease.renew()
        execution, created = ProbeExecution.objects.get_or_create(
            experiment=experiment, attempt=lease.attempt, probe=probe.name, side=side,
            variant=key, repeat_index=repeat,
            defaults={
                "exit_code": result.exit_code, "reason": result.reason,
                "detail": "\n".join([result.detail, *problems]).strip(),
                "wall_seconds": result.wall_seconds,
                "stdout": result.stdout[-KEPT_OUTPUT_BYTES:].decode("utf-8", "replace"),
                "stderr": result.stderr[-KEPT_OUTPUT_BYTES:].decode("utf-8", "replace"),
            },
        )
        if not created:
            return
        Sample.objects.bulk_create(
            Sample(
                execution=execution, experiment=experiment, probe=probe.name, side=side,
                variant=key, metric=row["name"], value=row["value"], unit=row["unit"],
                case=row["case"], labels=row["labels"],
            )
            for row in samples
        )


class MetricRow(TypedDict):
    name: str
    value: float
    unit: str
    case: str
    labels: dict[str, Any]


def read_metrics(path: Path, limit: int = 100_000) -> tuple[list[MetricRow], list[str]]:
    """Parse metrics.jsonl; malformed lines are skipped and named, never fatal."""
    rows: list[MetricRow] = []
    problems: list[str] = []
    if not path.is_file():
        return rows, ["the probe wrote no metrics.jsonl"]
    with path.open(encoding="utf-8", errors="replace") as handle:
        for number, line in enumerate(handle, start=1):
            if number > limit:
                problems.append(f"metrics.jsonl: only the first {limit} lines were read")
                break
            if not line.strip():
                continue
            try:
                raw = json.loads(line)
                if not isinstance(raw, dict):
                    raise ValueError("not an object")
                if not math.isfinite(float(raw["value"])):
                    raise ValueError(f"value {raw['value']!r} is not a finite number")
                labels = raw.get("labels", {})
                if not isinstance(labels, dict):
                    raise ValueError("labels must be an object")
                rows.append(MetricRow(
                    name=str(raw["name"])[:100], value=float(raw["value"]),
                    unit=str(raw.get("unit", ""))[:40], case=str(raw.get("case", ""))[:200],
                    labels=labels,
                ))
            except (ValueError, KeyError, TypeError) as exc:
                problems.append(f"metrics.jsonl line {number} skipped: {exc}")
    return rows, problems[:20]


def _finish(lease: _Lease, *, failure: str) -> None:
    rows = [
        SampleRow(probe=s.probe, side=s.side, variant=s.variant, metric=s.metric,
                  value=s.value, unit=s.unit, case=s.case)
        for s in Sample.objects.filter(
            experiment_id=lease.experiment_id, execution__attempt=lease.attempt
        ).only("probe", "side", "variant", "metric", "value", "unit", "case")
    ]
    summary = {"attempt": lease.attempt,
               "comparisons": [c.as_dict() for c in compare_samples(rows)]}
    with transaction.atomic():
        finished = Experiment.objects.filter(
            pk=lease.experiment_id, claimed_by=lease.worker, attempts=lease.attempt,
            status=Experiment.Status.RUNNING,
        ).update(
            status=Experiment.Status.FAILED if failure else Experiment.Status.SUCCEEDED,
            failure_reason=failure, summary=summary, finished_at=timezone.now(),
            lease_expires_at=None,
        )
        if finished == 1:
            transaction.on_commit(
                lambda: experiment_finished.send(Experiment, experiment_id=lease.experiment_id)
            )


def _cleanup(target: Target, workdir: Path) -> None:
    for side in ("baseline", "candidate"):
        if (workdir / side).exists():
            try:
                gitops.worktree_remove(target.clone_path, workdir / side)
            except gitops.GitError:
                log.exception("could not remove worktree %s", workdir / side)
    shutil.rmtree(workdir, ignore_errors=True)


def experiments_reap() -> list[int]:
    """Re-queue experiments whose lease expired (their worker died). Returns their ids."""
    from infraops.tasks import experiment_execute

    expired = list(
        Experiment.objects.filter(
            status=Experiment.Status.RUNNING, lease_expires_at__lt=timezone.now()
        ).values_list("pk", "queue")
    )
    for pk, queue in expired:
        experiment_execute.apply_async((pk,), queue=queue)
    return [pk for pk, _ in expired]
