"""What a probe execution leaves behind: samples (bulk COPY), artifacts (content-addressed
store), and its output streamed as batched log rows with live notifications."""

from __future__ import annotations

import json
import math
import os
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO, TypedDict

from django.db import connection, transaction
from django.db.models import F

from infraops.dbretry import retried
from infraops.experiments.blobstore import blob_store
from infraops.live import notify
from infraops.manifest import MAX_METRIC_NAME, MAX_UNIT
from infraops.models import Artifact, Experiment, ExperimentLog, ProbeExecution, Sample

METRICS_LINES_LIMIT = 100_000
# A metrics.jsonl line is refused whole beyond these, with the reason: cutting a name, case or
# unit to its column would merge metrics that differ, and a large labels object would be
# stored again with every sample of the line's execution.
MAX_LINE_CHARS = 64 * 1024
MAX_LABELS_CHARS = 4096
MAX_LABELS_DEPTH = 4
MAX_CASE = 200  # Sample.case
MAX_PROBLEMS_NAMED = 20
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
    """Parse metrics.jsonl; a malformed line is refused whole with its reason (stored on the
    execution), never cut to fit and never fatal. The problems are at most
    MAX_PROBLEMS_NAMED lines, the last counting those not named."""
    rows: list[MetricRow] = []
    problems: list[str] = []
    fd = _open_regular(path)
    if fd is None:
        what = "is not a regular file" if path.is_symlink() or path.exists() else "is missing"
        return rows, [f"metrics.jsonl {what}: the probe reported no metrics"]
    with os.fdopen(fd, encoding="utf-8", errors="replace") as handle:
        for number, line in enumerate(_lines(handle), start=1):
            if number > limit:
                problems.append(f"metrics.jsonl: only the first {limit} lines were read")
                break
            if line is None:
                problems.append(f"metrics.jsonl line {number} skipped: longer than "
                                f"{MAX_LINE_CHARS} characters")
                continue
            if not line.strip():
                continue
            try:
                rows.append(_metric_row(json.loads(line)))
            except RecursionError:
                problems.append(f"metrics.jsonl line {number} skipped: nested too deep to read")
            except (ValueError, KeyError, TypeError, ArithmeticError) as exc:
                problems.append(f"metrics.jsonl line {number} skipped: {exc}")
    if len(problems) > MAX_PROBLEMS_NAMED:
        more = len(problems) - MAX_PROBLEMS_NAMED + 1
        problems = [*problems[:MAX_PROBLEMS_NAMED - 1],
                    f"metrics.jsonl: {more} more problems like these"]
    return rows, problems


def _lines(handle: TextIO) -> Iterator[str | None]:
    """The file's lines; None for one longer than MAX_LINE_CHARS, which is skipped without
    being held in memory whole."""
    while line := handle.readline(MAX_LINE_CHARS + 1):
        if len(line) <= MAX_LINE_CHARS or line.endswith("\n"):
            yield line
            continue
        while (rest := handle.readline(MAX_LINE_CHARS)) and not rest.endswith("\n"):
            pass
        yield None


def _metric_row(raw: object) -> MetricRow:
    """One line as a row, or ValueError/KeyError with the reason it is refused: a name, unit
    and case are strings that fit their columns, the value a finite JSON number ("1" and
    true are not numbers), the labels an object of bounded size and depth."""
    if not isinstance(raw, dict):
        raise ValueError("not a JSON object")
    value = raw["value"]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"value {json.dumps(value)[:40]} is not a finite number: write a JSON "
                         "number (\"1\" and true are not numbers)")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"value {raw['value']!r} is not a finite number")
    name = _text(raw, "name", MAX_METRIC_NAME, required=True)
    unit = _text(raw, "unit", MAX_UNIT)
    case = _text(raw, "case", MAX_CASE)
    labels = raw.get("labels", {})
    if not isinstance(labels, dict):
        raise ValueError("labels must be an object")
    encoded = json.dumps(labels)
    if len(encoded) > MAX_LABELS_CHARS:
        raise ValueError(f"labels are {len(encoded)} characters as JSON; at most "
                         f"{MAX_LABELS_CHARS}")
    if _depth(labels) > MAX_LABELS_DEPTH:
        raise ValueError(f"labels are nested deeper than {MAX_LABELS_DEPTH} levels")
    if any("\x00" in text for text in (name, unit, case)) or "\\u0000" in encoded:
        raise ValueError("NUL characters are not allowed in names, units, cases or labels")
    return MetricRow(name=name, value=value, unit=unit, case=case, labels=labels)


def _text(raw: dict[str, Any], key: str, limit: int, *, required: bool = False) -> str:
    """A string field that fits its `limit`-character column; refused, never cut."""
    if required and key not in raw:
        raise KeyError(key)
    value = raw.get(key, "")
    if not isinstance(value, str):
        raise ValueError(f"{key} must be a string, got {json.dumps(value)[:40]}")
    if len(value) > limit:
        raise ValueError(f"{key} {value[:20]!r}... is {len(value)} characters; at most {limit}")
    return value


def _depth(value: object) -> int:
    """How deep lists and objects nest in a parsed JSON value (a scalar is 0)."""
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


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
