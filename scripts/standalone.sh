#!/usr/bin/env bash
# The whole system on this machine: embedded PostgreSQL and Redis unless DATABASE_URL /
# REDIS_URL are set, web and workers, the example target. Arguments go to `standalone`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# Bytecode is cached even where the environment says not to (some machines set
# PYTHONDONTWRITEBYTECODE): every start of web, workers and manage.py would compile the project
# again; with the cache a warm start took about 6 s instead of 7.2 s (bench/start.py --warm-only).
unset PYTHONDONTWRITEBYTECODE
exec .venv/bin/python manage.py standalone "$@"
