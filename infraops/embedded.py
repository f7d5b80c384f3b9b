"""The embedded PostgreSQL's address (pgserver), for `standalone` and for scripts that join a
standalone's database from another process (bench/gpu_worker.py). No Django: importable before
the settings are."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote


def postgres_url(server: Any, database: str) -> str:
    """A DATABASE_URL for `database` on a pgserver server, through its Unix socket."""
    socket_dir = server.get_uri().split("host=", 1)[1].split("&", 1)[0]
    return f"postgres://postgres@{quote(socket_dir, safe='')}/{database}"
