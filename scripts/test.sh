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
# mypy loads the settings (django-stubs), which refuse to start without a key outside DEBUG.
echo "== mypy"; SECRET_KEY="${SECRET_KEY:-type-checking-only}" .venv/bin/mypy .
# pytest-xdist: the tests run in $processes worker processes, each on its own test database
# (pytest-django adds _gw<N>) and its own Redis database (tests/xdist_workers.py counts down
# from REDIS_URL's). Most end-to-end tests wait on real processes, so two share two cores well.
processes="${INFRAOPS_TEST_PROCESSES:-2}"
pytest_parallel=(env PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" .venv/bin/pytest
                 -p tests.xdist_workers -n "$processes" --dist loadgroup --durations=25)
if [ "$#" -gt 0 ]; then
  echo "== pytest"; exec "${pytest_parallel[@]}" "$@"
fi

# The whole suite, in three parts side by side, each on its own test database and Redis
# databases so they never meet:
# - the fuzz (CPU-bound page rendering, minutes);
# - the browser tests, in a process of their own: Playwright's sync API keeps an event loop
#   running in its thread for the rest of the process, so nothing else may follow them there,
#   and they spend most of their time waiting on Chromium and the system's processes;
# - the rest, in the pytest-xdist processes above.
with_path() {  # URL $1 with its path replaced by $2
  .venv/bin/python -c 'import sys, urllib.parse as u
print(u.urlunsplit(u.urlsplit(sys.argv[1])._replace(path=sys.argv[2])))' "$1" "$2"
}
fuzz_db="${TEST_FUZZ_DATABASE_URL:-$(with_path "$DATABASE_URL" /infraops_fuzz)}"
fuzz_redis="${TEST_FUZZ_REDIS_URL:-$(with_path "$REDIS_URL" /15)}"
browser_db="${TEST_BROWSER_DATABASE_URL:-$(with_path "$DATABASE_URL" /infraops_browser)}"
# Below the xdist processes' databases and their spares (tests/xdist_workers.py).
browser_redis="${TEST_BROWSER_REDIS_URL:-$(with_path "$REDIS_URL" /6)}"
logs="$(mktemp -d -t infraops-test.XXXXXX)"
echo "== pytest (the fuzz and the browser tests beside the rest; their output follows at the end)"
# Niced: it has no clock to beat, and the others wait on real processes that need the CPU
# when they wake; the fuzz takes what they leave.
DATABASE_URL="$fuzz_db" REDIS_URL="$fuzz_redis" nice -n 10 .venv/bin/pytest -m fuzz -q \
  >"$logs/fuzz" 2>&1 &
fuzz_pid=$!
DATABASE_URL="$browser_db" REDIS_URL="$browser_redis" .venv/bin/pytest -m "browser and not fuzz" \
  -q --durations=10 >"$logs/browser" 2>&1 &
browser_pid=$!
status=0
"${pytest_parallel[@]}" -m "not fuzz and not browser" || status=$?
# pytest exits 5 when it collects nothing: a part without tests is not a failure.
for part in browser fuzz; do
  pid_var="${part}_pid"
  part_status=0
  wait "${!pid_var}" || part_status=$?
  echo "== pytest ($part)"
  cat "$logs/$part"
  if [ "$part_status" -ne 0 ] && [ "$part_status" -ne 5 ]; then status=$part_status; fi
done
rm -rf "$logs"
exit "$status"
