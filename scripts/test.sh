#!/usr/bin/env bash
# The whole test suite: lint (ruff), types (mypy + django-stubs), then pytest on real
# PostgreSQL and Redis, including a browser test in Debian's Chromium.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh

# PostgreSQL and Redis: this machine class starts them before a session; start them if not.
if ! pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql)" main start
fi
if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
fi
for _ in $(seq 50); do redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 && break; sleep 0.2; done

export DATABASE_URL="${TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/infraops}"
export REDIS_URL="${TEST_REDIS_URL:-redis://127.0.0.1:6379/14}"
export DJANGO_ALLOW_ASYNC_UNSAFE=true  # Playwright's sync API runs an event loop in the test thread

echo "== ruff"; .venv/bin/ruff check .
echo "== mypy"; .venv/bin/mypy .
echo "== pytest"; .venv/bin/pytest "$@"
