#!/usr/bin/env bash
# The whole system on this machine: embedded PostgreSQL and Redis unless DATABASE_URL /
# REDIS_URL are set, web and workers, the example target. Arguments go to `standalone`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python manage.py standalone "$@"
