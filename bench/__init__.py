"""Benchmarks (scripts; see README.md). A package so that tests can import their helpers.

What the scripts share: a database of their own on DATABASE_URL's server.
BENCH_TEMPLATE_DATABASE, when set, names a migrated database that a script's own database is
created from (CREATE DATABASE ... TEMPLATE), so that its migrate has nothing left to do: the
smoke tests (tests/bench/test_bench_smoke.py) migrate one template for all of them.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit, urlunsplit

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/postgres"
TEMPLATE_ENV = "BENCH_TEMPLATE_DATABASE"


def database_url(name: str, url: str | None = None) -> str:
    """`url` (DATABASE_URL by default) naming the database `name` on the same server."""
    base = url or os.environ.get("DATABASE_URL") or DEFAULT_DATABASE_URL
    return urlunsplit(urlsplit(base)._replace(path=f"/{name}"))


def database_create(name: str, *, url: str | None = None, replace: bool = True,
                    template: str | None = None) -> str:
    """Create the database `name` on `url`'s server (DATABASE_URL's by default), as a copy of
    `template` (BENCH_TEMPLATE_DATABASE by default) when there is one; `replace`: drop it
    first, else keep one that exists. Returns its URL."""
    import psycopg
    from psycopg import sql

    database = sql.Identifier(name)
    template = template or os.environ.get(TEMPLATE_ENV)
    with psycopg.connect(database_url("postgres", url), autocommit=True) as conn:
        if replace:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(database))
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s",
                              (name,)).fetchone() is not None
        if not exists and template:
            conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                database, sql.Identifier(template)))
        elif not exists:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(database))
    return database_url(name, url)


def database_drop(name: str, *, url: str | None = None) -> None:
    """Drop the database `name` on `url`'s server (DATABASE_URL's by default), if it exists."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(database_url("postgres", url), autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
            sql.Identifier(name)))
