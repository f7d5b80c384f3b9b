"""Review queue figures with 100,000 changes. Prints `figure: <name> <value> <unit>` lines.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres REDIS_URL=redis://127.0.0.1:6379/13 \
        .venv/bin/python bench/review_queue.py [--changes 100000] [--rounds 10] [--smoke] \
        [--database infraops_bench_queue]

It creates (and drops) its own database (--database, `infraops_bench_queue` unless told) on
DATABASE_URL's server, fills it with 100,000 changes over a year (about 9% awaiting review,
most of them recent; mixed risk classes, 12 targets, 40 goals, generated titles), and measures
through Django's test client (every middleware, the session, the templates) as a reviewer of
two classes:

- queue_page_p95_ms: the full page;
- queue_partial_p95_ms: the table fragment (HX-Request, HX-Target: queue-table);
- queue_count_nav_p95_ms: the navigation's count query alone;

each over 80 requests: 10 rounds of 8 addresses (my queue, a class, a target, a title search,
a search of every change, all changes of every status, the second page, a page 2,000 rows
deep), after one warm-up round. Also the queries per request, each address's median, and
queue_partial_search_miss_all_ms: a title search of every change that finds nothing (the
worst case of icontains: every title is read).
Targets (issue): <= 150 and <= 100.

BENCH_EXTRA_INDEXES=1 first creates the trigram index on titles (EXTRA_INDEXES, not in the
schema: pg_trgm may be missing from an embedded PostgreSQL), to measure with and without it;
BENCH_KEEP_DATABASE=1 keeps the database to EXPLAIN queries.

--smoke: 3,000 changes, 2 rounds, a page 600 rows deep, a few requests for the count and the
miss (seconds; the figures show that it runs, not how fast the queue is).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench import database_create, database_drop  # noqa: E402

BENCH_DB = "infraops_bench_queue"
CHANGES = 100_000
# More rows than one INSERT may carry (about 2,700 of today's Change), so that a smoke run
# goes through bulk_create's batching too.
SMOKE_CHANGES = 3_000
# PostgreSQL's Bind message counts its parameters in 16 bits: one INSERT takes at most this
# many, one per field and row (batch_size).
PG_MAX_PARAMETERS = 65_535
EXTRA_INDEXES = [
    # icontains is UPPER(title) LIKE UPPER(%s): a trigram index answers a search that matches
    # little without reading every title.
    "CREATE EXTENSION IF NOT EXISTS pg_trgm",
    "CREATE INDEX change_title_trgm ON reviews_change USING gin ((UPPER(title)) gin_trgm_ops)",
]
ROUNDS = 10
SMOKE_ROUNDS = 2
PAGE = 25  # rows a queue page shows
DEEP_ROWS = 2_000  # how deep the deep page is (at full size)
VERBS = ["Tune", "Raise", "Lower", "Cache", "Batch", "Fuse", "Pin", "Prefetch", "Shard",
         "Quantise", "Reorder", "Inline", "Overlap", "Pipeline", "Drop", "Coalesce"]
OBJECTS = ["batch_size", "max_queue", "the kv cache block size", "the attention kernel",
           "the tokenizer pool", "the scheduler tick", "prefill chunks", "decode threads",
           "NCCL buffers", "fp16 accumulation", "request coalescing", "the page allocator",
           "speculative decoding", "the warm-up path", "CUDA graphs", "the router's retries"]
WHERE = ["", " on llama-70b", " for the p95", " in the router", " under burst load",
         " on the H100 pool", " for long prompts", " at low concurrency"]
CLASS_SETS = [[], [], [], ["numerics"], ["concurrency"], ["production"], ["unclassified"],
              ["numerics"], ["production"], ["numerics", "production"],
              ["concurrency", "production"], ["numerics", "concurrency"],
              ["numerics", "concurrency", "production"]]
CHECKS = ["criteria", "diff policy", "risk", "base moved", "boundary"]
OLD_STATUSES = (["merged"] * 50 + ["rejected"] * 15 + ["changes_requested"] * 8
                + ["merge_failed"] * 4 + ["conflict"] * 4 + ["approved"] * 2
                + ["pending_review"] * 5)
NEW_STATUSES = (["pending_review"] * 45 + ["changes_requested"] * 15 + ["merged"] * 20
                + ["approved"] * 5 + ["reverifying"] * 5 + ["merging"] * 5 + ["rejected"] * 5)


def figure(name: str, value: float, unit: str) -> None:
    print(f"figure: {name} {value:.4g} {unit}", flush=True)


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20)[-1]


def batch_size(model: Any) -> int:
    """Rows per INSERT of bulk_create that stay under PG_MAX_PARAMETERS: one parameter per
    concrete field and row (the primary key counted too, in case it is set)."""
    return PG_MAX_PARAMETERS // len(model._meta.concrete_fields)


def setup(database: str) -> None:
    os.environ["DATABASE_URL"] = database_create(database)
    os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/13")
    os.environ["INFRAOPS_DATA"] = tempfile.mkdtemp(prefix="infraops-bench-queue-")
    os.environ["DJANGO_SETTINGS_MODULE"] = "infraops.project.settings"
    # Outside DEBUG the settings refuse to start without a key; the bench signs nothing.
    os.environ.setdefault("SECRET_KEY", "bench-" + os.urandom(16).hex())
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


@contextmanager
def explicit_created_at() -> Iterator[None]:
    """bulk_create fills auto_now_add fields with now(); the bench needs a year of ages."""
    from reviews.models import Change

    field = Change._meta.get_field("created_at")
    field.auto_now_add = False
    try:
        yield
    finally:
        field.auto_now_add = True


def seed(changes: int) -> Any:  # the reviewer
    from django.contrib.auth.models import Group, User
    from django.db import connection
    from django.utils import timezone

    from infraops.models import Goal, Target, TargetMembership
    from reviews.models import Change, ReviewerProfile

    rng = random.Random(7)
    reviewer = User.objects.create_user("rae", password="unused-bench-password")
    reviewer.groups.add(Group.objects.get_or_create(name="reviewer")[0])
    ReviewerProfile.objects.create(user=reviewer, risk_classes=["numerics", "concurrency"])
    owner = User.objects.create_user("erin", password="unused-bench-password")
    targets = [Target.objects.create(name=f"serving-{n}", repo_url=f"/srv/git/serving-{n}.git")
               for n in range(12)]
    # A reviewer sees the targets they are a member of: all twelve, as one team's reviewer.
    TargetMembership.objects.bulk_create(
        TargetMembership(target=target, user=reviewer, role="reviewer") for target in targets)
    goals = [Goal.objects.create(target=targets[n % 12], name=f"goal {n}", probe="latency",
                                 metric="latency_ms", relative_target=0.1, owner=owner)
             for n in range(40)]
    now = timezone.now()
    step = timedelta(days=365) / changes
    diff = "".join(f"-batch_size = {n}\n+batch_size = {n * 2}\n" for n in range(20))
    rows = []
    for n in range(changes):  # oldest first, so ids rise with created_at as in production
        created = now - step * (changes - n) + timedelta(seconds=rng.random() * 60)
        recent = now - created < timedelta(days=7)
        gate = [{"name": name, "passed": rng.random() < 0.8, "detail": "measured"}
                for name in rng.sample(CHECKS, rng.randint(3, 5))]
        goal = rng.choice(goals) if rng.random() < 0.85 else None
        rows.append(Change(
            target=goal.target if goal else rng.choice(targets), goal=goal,
            title=f"{rng.choice(VERBS)} {rng.choice(OBJECTS)}{rng.choice(WHERE)} (run {n // 7})",
            hypothesis="A hypothesis of a few sentences. " * 4, diff=diff,
            diff_sha256=Change.hash_diff(diff), base_commit="a" * 40, head_commit="b" * 40,
            risk_classes=rng.choice(CLASS_SETS), gate=gate,
            gate_passed=all(c["passed"] for c in gate),
            status=rng.choice(NEW_STATUSES if recent else OLD_STATUSES),
            author_label=f"run {n // 7}", created_at=created))
    with explicit_created_at():
        Change.objects.bulk_create(rows, batch_size=batch_size(Change))
    with connection.cursor() as cursor:
        if os.environ.get("BENCH_EXTRA_INDEXES"):
            for statement in EXTRA_INDEXES:
                cursor.execute(statement)
            print("  with the extra indexes")
        cursor.execute("VACUUM ANALYZE reviews_change")
    return reviewer


def addresses(client: Any, changes: int) -> list[str]:
    import re

    from infraops.models import Target

    def next_of(url: str) -> str:
        page = client.get(url).content.decode()
        found = re.search(r'<a rel="next" href="([^"]+)"', page)
        assert found, f"no next page after {url}"
        return found.group(1).replace("&amp;", "&")

    deep = "/reviews/?scope=all&status=any"
    # 80 pages of 25: 2,000 rows deep; a fifth of every change with fewer of them.
    for _ in range(min(DEEP_ROWS, changes // 5) // PAGE):
        deep = next_of(deep)
    return [
        "/reviews/", "/reviews/?class=numerics",
        f"/reviews/?target={Target.objects.order_by('pk').values_list('pk', flat=True)[3]}",
        "/reviews/?q=kv+cache", "/reviews/?scope=all&status=any&q=NCCL",
        "/reviews/?scope=all&status=any", next_of("/reviews/"), deep,
    ]


def timed(client: Any, url: str, headers: dict[str, str]) -> tuple[float, int]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        start = time.perf_counter()
        response = client.get(url, headers=headers)
        elapsed = (time.perf_counter() - start) * 1000
    assert response.status_code == 200, (url, response.status_code)
    return elapsed, len(queries)


def measure(client: Any, urls: list[str], name: str, headers: dict[str, str],
            rounds: int) -> None:
    for url in urls:  # warm-up: templates compiled, connection and plans cached
        timed(client, url, headers)
    times: dict[str, list[float]] = {url: [] for url in urls}
    counts: set[int] = set()
    for _ in range(rounds):
        for url in urls:
            elapsed, queries = timed(client, url, headers)
            times[url].append(elapsed)
            counts.add(queries)
    every = [t for ts in times.values() for t in ts]
    figure(f"{name}_p95_ms", p95(every), "ms")
    figure(f"{name}_median_ms", statistics.median(every), "ms")
    print(f"  {name}: {len(every)} requests, {min(counts)}-{max(counts)} queries each")
    for url, ts in times.items():
        shown = url if len(url) < 60 else url[:57] + "..."
        print(f"  {statistics.median(ts):7.1f} ms median  {shown}")


def measure_search_miss(client: Any, repeat: int) -> None:
    url = "/reviews/?scope=all&status=any&q=no-such-title"
    headers = {"HX-Request": "true", "HX-Target": "queue-table"}
    timed(client, url, headers)
    times = [timed(client, url, headers)[0] for _ in range(repeat)]
    figure("queue_partial_search_miss_all_ms", statistics.median(times), "ms")


def measure_count(reviewer: Any, repeat: int) -> None:
    from reviews.live import awaiting_for_classes

    classes = list(reviewer.reviewer_profile.risk_classes)
    awaiting_for_classes(classes).count()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        awaiting_for_classes(classes).count()
        times.append((time.perf_counter() - start) * 1000)
    figure("queue_count_nav_p95_ms", p95(times), "ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--changes", type=int, help=f"changes to seed ({CHANGES:,})")
    parser.add_argument("--rounds", type=int, help=f"rounds over the addresses ({ROUNDS})")
    parser.add_argument("--smoke", action="store_true",
                        help=f"a tiny run: {SMOKE_CHANGES:,} changes, {SMOKE_ROUNDS} rounds")
    parser.add_argument("--database", default=BENCH_DB,
                        help="the database to create (and drop) on DATABASE_URL's server")
    args = parser.parse_args()
    changes = args.changes or (SMOKE_CHANGES if args.smoke else CHANGES)
    rounds = args.rounds or (SMOKE_ROUNDS if args.smoke else ROUNDS)
    setup(args.database)
    try:
        from django.test import Client

        start = time.perf_counter()
        reviewer = seed(changes)
        print(f"  seeded {changes} changes in {time.perf_counter() - start:.1f} s")
        client = Client(HTTP_HOST="localhost")
        client.force_login(reviewer)
        urls = addresses(client, changes)
        measure(client, urls, "queue_page", {}, rounds)
        measure(client, urls, "queue_partial", {"HX-Request": "true", "HX-Target": "queue-table"},
                rounds)
        measure_count(reviewer, 10 if args.smoke else 80)
        measure_search_miss(client, 3 if args.smoke else 10)
    finally:
        from django.db import connections

        connections.close_all()
        if not os.environ.get("BENCH_KEEP_DATABASE"):  # kept: to EXPLAIN the queries after
            database_drop(args.database)
        shutil.rmtree(os.environ["INFRAOPS_DATA"], ignore_errors=True)


if __name__ == "__main__":
    main()
