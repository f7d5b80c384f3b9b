"""What a probe execution leaves behind: samples (bulk COPY), artifacts (content-addressed
store), and its output streamed as batched log rows with live notifications."""

from __future__ import annotations

import json
import math
import os
import stat
import threading
import time
from pathlib import Path
from typing import Any, TypedDict

from django.db import connection, transaction
from django.db.models import F

from infraops.dbretry import retried
from infraops.experiments.blobstore import blob_store
from infraops.live import notify
from infraops.models import Artifact, Experiment, ExperimentLog, ProbeExecution, Sample

METRICS_LINES_LIMIT = 100_000
ARTIFACT_FILES_LIMIT = 1_000
ARTIFACT_BYTES_LIMIT = 256 * 1024 * 1024
LOG_FLUSH_SECONDS = 0.1


def experiment_group(experiment_id: int) -> str:
    return f"experiment-{experiment_id}"


def experiment_changed(experiment_id: int, **_: Any) -> None:
    """Tell the experiment's open pages that its state moved (claimed, finished, failed),
    after the commit: they re-read status, feedback, charts and tables over HTTP. Connected
    to experiment_finished (infraops.apps) and called where a worker claims it."""
    notify(experiment_group(experiment_id), {"type": "experiment.changed"})


class MetricRow(TypedDict):
    name: str
    value: float
    unit: str
    case: str
    labels: dict[str, Any]


def _open_regular(path: Path) -> int | None:
    """An fd for a regular file written by a probe, never following a link it planted
    (a link to /etc/shadow would otherwise be read by the worker, outside the sandbox)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


def read_metrics(path: Path, limit: int = METRICS_LINES_LIMIT) -> tuple[list[MetricRow], list[str]]:
    """Parse metrics.jsonl; malformed lines are skipped and named, never fatal."""
    rows: list[MetricRow] = []
    problems: list[str] = []
    fd = _open_regular(path)
    if fd is None:
        what = "is not a regular file" if path.is_symlink() or path.exists() else "is missing"
        return rows, [f"metrics.jsonl {what}: the probe reported no metrics"]
    with os.fdopen(fd, encoding="utf-8", errors="replace") as handle:
        for number, line in enumerate(handle, start=1):
            if number > limit:
                problems.append(f"metrics.jsonl: only the first {limit} lines were read")
                break
            if not line.strip():
                continue
            try:
                rows.append(_metric_row(json.loads(line)))
            except (ValueError, KeyError, TypeError, ArithmeticError) as exc:
                problems.append(f"metrics.jsonl line {number} skipped: {exc}")
    return rows, problems[:20]


def _metric_row(raw: object) -> MetricRow:
    if not isinstance(raw, dict):
        raise ValueError("not a JSON object")
    value = float(raw["value"])
    if not math.isfinite(value):
        raise ValueError(f"value {raw['value']!r} is not a finite number")
    labels = raw.get("labels", {})
    if not isinstance(labels, dict):
        raise ValueError("labels must be an object")
    texts = [str(raw["name"]), str(raw.get("unit", "")), str(raw.get("case", "")),
             json.dumps(labels)]
    if any("\x00" in text or "\\u0000" in text for text in texts):
        raise ValueError("NUL characters are not allowed in names, units, cases or labels")
    return MetricRow(name=texts[0][:100], value=value, unit=texts[1][:40], case=texts[2][:200],
                     labels=labels)


def printable(data: bytes) -> str:
    """Probe output as text PostgreSQL can store: undecodable bytes replaced, NUL shown."""
    return data.decode("utf-8", "replace").replace("\x00", "\ufffd")


def instruction_rows(out_dir: Path, prefix: str = "callgrind.") -> list[MetricRow]:
    """One `instructions` sample: the total over every callgrind file the run left (one per
    process under --trace-children). Unreadable files are skipped; none gives no row."""
    from infraops.feedback.stats import parse_callgrind_total

    total, found = 0, False
    for path in sorted(out_dir.glob(f"{prefix}*.out"))[:64]:
        fd = _open_regular(path)
        if fd is None:
            continue
        with os.fdopen(fd, encoding="utf-8", errors="replace") as handle:
            try:
                total += parse_callgrind_total(handle.read(64 << 20))
                found = True
            except ValueError:
                continue
    if not found:
        return []
    return [MetricRow(name="instructions", value=float(total), unit="instructions", case="",
                      labels={})]


SAMPLE_COLUMNS = ("execution_id", "experiment_id", "probe", "side", "variant", "metric",
                  "value", "unit", "case", "labels")


def samples_copy(execution: ProbeExecution, rows: list[MetricRow]) -> int:
    """Store rows as Samples with PostgreSQL COPY (one round trip for any number)."""
    if not rows:
        return 0
    columns = ", ".join(f'"{c}"' for c in SAMPLE_COLUMNS)
    with connection.cursor() as cursor, cursor.copy(
        f"COPY {Sample._meta.db_table} ({columns}) FROM STDIN"
    ) as copy:
        for row in rows:
            copy.write_row((execution.pk, execution.experiment_id, execution.probe, execution.side,
                            execution.variant, row["name"], row["value"], row["unit"], row["case"],
                            json.dumps(row["labels"])))
    return len(rows)


def artifacts_link(execution: ProbeExecution, kept: list[Artifact]) -> None:
    for artifact in kept:
        artifact.execution = execution
    Artifact.objects.bulk_create(kept)


def artifacts_collect(out_dir: Path) -> tuple[list[Artifact], list[str]]:
    """Copy every regular file of out_dir into the blob store (no database: run it outside a
    transaction); returns unsaved Artifact rows and the problems met."""
    store = blob_store()
    problems: list[str] = []
    kept: list[Artifact] = []
    total = 0
    for path in sorted(out_dir.rglob("*")):
        name = path.relative_to(out_dir).as_posix()
        if path.is_dir() and not path.is_symlink():
            continue
        fd = _open_regular(path)
        if fd is None:
            problems.append(f"{name} skipped: not a regular file")
            continue
        size = os.fstat(fd).st_size
        os.close(fd)
        if len(kept) >= ARTIFACT_FILES_LIMIT or total + size > ARTIFACT_BYTES_LIMIT:
            problems.append(f"artifacts capped at {ARTIFACT_FILES_LIMIT} files / "
                            f"{ARTIFACT_BYTES_LIMIT >> 20} MiB: {name} and later files skipped")
            break
        sha, size = store.put(path)
        total += size
        kept.append(Artifact(name=name[:300], sha256=sha, size=size))
    return kept, problems


class LogStream:
    """Collects a probe's output chunks and writes them as ExperimentLog rows at most every
    LOG_FLUSH_SECONDS, each batch followed by one live notification. The tail of a burst is
    written with the next chunk or at close()."""

    def __init__(self, experiment_id: int, label: str) -> None:
        self.experiment_id, self.label = experiment_id, label
        self._pending: list[tuple[str, str]] = []
        self._last_flush = 0.0
        self._lock = threading.Lock()

    def __call__(self, stream: str, chunk: bytes) -> None:
        with self._lock:
            self._pending.append((stream, printable(chunk)))
        if time.monotonic() - self._last_flush >= LOG_FLUSH_SECONDS:
            self.flush()

    def close(self) -> None:
        self.flush()

    def flush(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        self._last_flush = time.monotonic()
        if not pending:
            return
        merged: list[tuple[str, str]] = []
        for stream, text in pending:  # one row per run of the same stream
            if merged and merged[-1][0] == stream:
                merged[-1] = (stream, merged[-1][1] + text)
            else:
                merged.append((stream, text))
        retried(lambda: self._write(merged), what=f"experiment {self.experiment_id} log")

    def _write(self, merged: list[tuple[str, str]]) -> None:
        with transaction.atomic():
            Experiment.objects.filter(pk=self.experiment_id).update(
                log_seq=F("log_seq") + len(merged))
            last = Experiment.objects.values_list("log_seq", flat=True).get(pk=self.experiment_id)
            first = last - len(merged) + 1
            ExperimentLog.objects.bulk_create(
                ExperimentLog(experiment_id=self.experiment_id, seq=first + i,
                              execution_label=self.label[:300], stream=stream, text=text)
                for i, (stream, text) in enumerate(merged)
            )
            notify(experiment_group(self.experiment_id), {"type": "log.lines", "upto": last})
