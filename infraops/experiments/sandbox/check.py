"""Whether a sandbox can be created on this host at all (:func:`sandbox_check`): one trivial
sandbox, started the way every probe's is, its pass kept and its failure retried."""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import time
from pathlib import Path

from infraops.experiments.sandbox import launch
from infraops.experiments.sandbox.config import (
    REASON_OK,
    SandboxLimits,
    SandboxSpec,
    SandboxUnavailable,
)
from infraops.experiments.sandbox.folders import sandbox_prepare_dir
from infraops.experiments.sandbox.runner import sandbox_run
from infraops.experiments.sandbox.uids import _run_identity

log = logging.getLogger("infraops.experiments.sandbox")  # one logger for the package

_check_lock = threading.Lock()
_check_cache: dict[str, str | None] = {}  # BWRAP -> None: only a check that passed is kept
_check_failures: dict[str, tuple[float, str]] = {}  # BWRAP -> (when, the last failure)
# A failed check is tried again after each of these pauses (seconds) before the process says it
# cannot run probes: a trivial sandbox can fail for a moment (EAGAIN while the host is short of
# processes, a busy /run) that one try must not turn into "this worker has no sandbox".
CHECK_RETRY_DELAYS: tuple[float, ...] = (0.2, 0.5, 1.0, 2.0)
# A failure stands this long (no new tries meanwhile); the next call checks again, with retries.
CHECK_FAILURE_SECONDS = 30.0


def sandbox_check() -> str | None:
    """None when a sandbox can be created here; otherwise the reason as one sentence (e.g.
    'bubblewrap (bwrap) is not installed: apt-get install bubblewrap').

    Starts one trivial sandbox (``true``) per BWRAP setting. A pass is kept for the life of the
    process; a failure is retried after each of CHECK_RETRY_DELAYS first (a missing bwrap is not:
    nothing transient about it), then stands for CHECK_FAILURE_SECONDS, after which the next call
    checks again."""
    key = launch.BWRAP  # read where the launcher reads it, at each call
    with _check_lock:
        if key in _check_cache:
            return _check_cache[key]
        failed = _check_failures.get(key)
        if failed is not None and time.monotonic() - failed[0] < CHECK_FAILURE_SECONDS:
            return failed[1]
        problem = _try_trivial_sandbox()
        for delay in CHECK_RETRY_DELAYS:
            if problem is None or problem.startswith(launch._NOT_INSTALLED):
                break
            log.warning("sandbox check failed (%s); trying again in %.1f s", problem, delay)
            time.sleep(delay)
            problem = _try_trivial_sandbox()
        if problem is None:
            _check_cache[key] = None
            _check_failures.pop(key, None)
        else:
            _check_failures[key] = (time.monotonic(), problem)
        return problem


def _try_trivial_sandbox() -> str | None:
    base = Path(tempfile.mkdtemp(prefix="infraops-sandbox-check-"))
    try:
        base.chmod(0o755)
        identity = _run_identity(None)
        work, out = base / "work", base / "out"
        for path in (work, out):
            sandbox_prepare_dir(path, identity)
        spec = SandboxSpec(command="true", workdir=work, out_dir=out, env={},
                           limits=SandboxLimits(wall_seconds=30.0))
        result = sandbox_run(spec, identity=identity)
    except SandboxUnavailable as exc:
        return str(exc)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    if result.reason != REASON_OK:
        return f"A trivial sandboxed command failed: {result.detail}."
    return None
