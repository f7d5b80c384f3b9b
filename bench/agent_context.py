"""What the LLM agent sends the model over a whole run. Prints `figure: <name> <value> <unit>`.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres REDIS_URL=redis://127.0.0.1:6379/10 \
        DJANGO_ALLOW_ASYNC_UNSAFE=true .venv/bin/python bench/agent_context.py \
        [--smoke] [--database infraops_bench_context]

The run: the demo's scripted precision fix (agents/scripted/demo.py, the goal "Numerics, by
the LLM agent" of examples/demo-kernels), served by the local OpenAI-compatible stub, steps
and experiments taken in this process one after the other as the workers would take them
(the experiments really run, sandboxed). Everything the run writes is rolled back, and the
database (made on DATABASE_URL's server, `infraops_bench_context` unless told) is dropped.

Tokens are counted as the product counts them: the usage the endpoint reports. The product
has no tokenizer of its own, and the scripted model reports a request's prompt tokens as its
bytes / 4 (agents/scripted/agent.py) and 20 completion tokens per answer, so the figures are
bytes / 4, the same measure before and after.

- request_tokens_first, _median, _max: the prompt tokens of each request;
- total_tokens: the run's tokens_used (prompt and completion, every step);
- tool_definitions_bytes: the `tools` of one request as the client sends them (compact
  JSON; issue target <= 5,000; before: 13,594, or 14,297 as json.dumps spaces them);
- total_vs_before: total_tokens / BEFORE_TOTAL, the same run on the code before issue 25
  (target <= 0.55);
- steps: the run's steps; the outcome (succeeded, the change pending review) is checked,
  and the script exits 1 if it differs (the figures of another run compare nothing).

--smoke: the same run (it takes seconds); the figures are the same.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench import database_create, database_drop  # noqa: E402

BENCH_DB = "infraops_bench_context"
GOAL = "Numerics, by the LLM agent: the parallel merge matches the sequential path"
# The same run on the code before issue 25 (b256552, main when this script was written):
# 9 requests of 4,427 / 6,233 / 7,512 prompt tokens (first / median / max), 14,297 bytes of
# tool definitions each; measured there again on 2026-12-07: 56,543 and 56,546 in all
# (bench/README.md).
BEFORE_TOTAL = 56_528
TARGET_RATIO = 0.55
TOOLS_TARGET_BYTES = 5_000
MAX_STEPS = 20


def figure(name: str, value: float | int, unit: str) -> None:
    print(f"figure: agent_context_{name} {value} {unit}", flush=True)


def setup(database: str) -> None:
    os.environ["DATABASE_URL"] = database_create(database)
    os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/10")
    data = tempfile.mkdtemp(prefix="infraops-bench-context-")
    os.chmod(data, 0o711)  # the sandbox's uid must reach the experiments' folders in it
    os.environ["INFRAOPS_DATA"] = data
    os.environ["DJANGO_SETTINGS_MODULE"] = "infraops.project.settings"
    os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    os.environ.setdefault("SECRET_KEY", "bench-" + os.urandom(16).hex())
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def run_the_fix() -> tuple[Any, list[Any], tuple[str, str | None]]:
    """The demo's precision fix, start to end: the run, the requests the model received, and
    the outcome (the run's status, its change's).
    Inside one transaction rolled back at the end: nothing is queued to a worker (the
    on-commit sends never happen), as in the tests."""
    from io import StringIO

    from django.conf import settings
    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.db import transaction

    from agents.scripted.demo import MODEL, DemoModel
    from agents.scripted.endpoint import OpenAIStub
    from agents.services import run_start, run_step, run_wake
    from infraops.experiments import services as experiments
    from infraops.experiments.services import experiment_execute
    from infraops.models import Goal

    # The lease's heartbeat thread has its own connection, which cannot see the experiment in
    # this open transaction: a probe slower than one beat (a loaded machine) read as a lost
    # lease and the run ended otherwise ("no news of experiment 1"). As in tests/conftest.py,
    # the lease is renewed only by this thread's own writes.
    experiments.RENEW_EVERY = 24 * 3600.0
    with OpenAIStub(fallback=DemoModel()) as endpoint, transaction.atomic():
        settings.OPENAI_BASE_URL, settings.OPENAI_API_KEY = endpoint.base_url, "bench"
        settings.INFRAOPS_MODEL = MODEL
        user = User.objects.create_superuser("bench", password=os.urandom(8).hex())
        call_command("load_example", "demo-kernels", stdout=StringIO())
        run = run_start(goal=Goal.objects.get(name=GOAL), user=user)
        for _ in range(MAX_STEPS):
            run_step(run_id=run.pk, number=run.step_count)
            run.refresh_from_db()
            if run.waiting_for_id:
                experiment_execute(experiment_id=run.waiting_for_id, worker="bench:1")
                run_wake(experiment_id=run.waiting_for_id)
                run.refresh_from_db()
            if run.is_finished or run.status == run.Status.PAUSED:
                break
        outcome = (run.status, run.changes.values_list("status", flat=True).first())
        transaction.set_rollback(True)
        return run, endpoint.requests, outcome


def report(run: Any, requests: list[Any], outcome: tuple[str, str | None]) -> int:
    prompt = [len(request.raw) // 4 for request in requests]
    # As the client sends them (httpx: no spaces, UTF-8), not as json.dumps spaces them.
    tools = len(json.dumps(requests[0].body["tools"], separators=(",", ":"),
                           ensure_ascii=False).encode())
    figure("request_tokens_first", prompt[0], "tokens")
    figure("request_tokens_median", int(statistics.median(prompt)), "tokens")
    figure("request_tokens_max", max(prompt), "tokens")
    figure("total_tokens", run.tokens_used, "tokens")
    figure("tool_definitions_bytes", tools, "bytes")
    figure("total_vs_before", round(run.tokens_used / BEFORE_TOTAL, 3), "ratio")
    figure("steps", run.step_count, "steps")
    if outcome != ("succeeded", "pending_review"):
        print(f"the run ended otherwise ({outcome}: {run.stop_reason}); the figures "
              "compare nothing", file=sys.stderr)
        return 1
    if run.tokens_used > TARGET_RATIO * BEFORE_TOTAL or tools > TOOLS_TARGET_BYTES:
        print(f"target missed: total {run.tokens_used} > {TARGET_RATIO} x {BEFORE_TOTAL}, or "
              f"tools {tools} > {TOOLS_TARGET_BYTES} bytes", file=sys.stderr)
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="the same run (it is small)")
    parser.add_argument("--database", default=BENCH_DB)
    args = parser.parse_args()
    try:
        setup(args.database)
        status = report(*run_the_fix())
    finally:
        from django.db import connections

        connections.close_all()
        database_drop(args.database)
        shutil.rmtree(os.environ.get("INFRAOPS_DATA", ""), ignore_errors=True)
    sys.exit(status)


if __name__ == "__main__":
    main()
