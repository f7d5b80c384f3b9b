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
# Bytecode is cached: this machine class's environment sets PYTHONDONTWRITEBYTECODE, and then
# every Python process the suite starts (pytest's workers, the web servers, Celery workers and
# manage.py commands of the end-to-end tests, the bench smokes) compiles the project's 35,000
# lines again, about half a second of CPU each, and pytest rewrites every test module again.
unset PYTHONDONTWRITEBYTECODE

echo "== ruff"; .venv/bin/ruff check .
# mypy (40 s of one core from a fresh clone) runs beside pytest, whose first minute leaves a
# core free; its report follows pytest's, and its failure fails the suite.
# It loads the settings (django-stubs), which refuse to start without a key outside DEBUG.
mypy_log="$(mktemp -t infraops-mypy.XXXXXX)"
SECRET_KEY="${SECRET_KEY:-type-checking-only}" .venv/bin/mypy . >"$mypy_log" 2>&1 &
mypy_pid=$!
mypy_report() {  # mypy's output and exit status, once it ends
  local mypy_status=0
  wait "$mypy_pid" || mypy_status=$?
  echo "== mypy"
  cat "$mypy_log"
  rm -f "$mypy_log"
  return "$mypy_status"
}
# pytest-xdist: the tests run in $processes worker processes, each on its own test database
# (pytest-django adds _gw<N>) and its own Redis database (tests/xdist_workers.py counts down
# from REDIS_URL's). Three on this 2-core machine class: the end-to-end tests spend most of
# their time waiting on real processes (their test process's own CPU is under half of its
# wall time), and a third process keeps both cores busy through those waits: the whole suite
# took 903 s from a fresh clone with three against 1,154 s with two, on the same machine.
processes="${INFRAOPS_TEST_PROCESSES:-3}"
pytest_parallel=(env PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" .venv/bin/pytest
                 -p tests.xdist_workers -n "$processes" --dist loadgroup --durations=25)
if [ "$#" -gt 0 ]; then
  echo "== pytest"
  status=0
  "${pytest_parallel[@]}" "$@" || status=$?
  mypy_report || status=$((status ? status : 1))
  exit "$status"
fi

# The whole suite: the fuzz (CPU-bound page rendering, minutes) runs beside the rest, on its
# own test database and Redis database. The browser tests run last in one of the xdist
# processes (tests/conftest.py groups them): by then the machine is quieter, and nothing else
# may follow them in a process (Playwright's sync API keeps an event loop in its thread).
with_path() {  # URL $1 with its path replaced by $2
  .venv/bin/python -c 'import sys, urllib.parse as u
print(u.urlunsplit(u.urlsplit(sys.argv[1])._replace(path=sys.argv[2])))' "$1" "$2"
}
fuzz_db="${TEST_FUZZ_DATABASE_URL:-$(with_path "$DATABASE_URL" /infraops_fuzz)}"
fuzz_redis="${TEST_FUZZ_REDIS_URL:-$(with_path "$REDIS_URL" /15)}"
fuzz_log="$(mktemp -t infraops-fuzz.XXXXXX)"
echo "== pytest (the fuzz beside the rest; its output follows at the end)"
# Niced: it has no clock to beat, and the others wait on real processes that need the CPU
# when they wake; the fuzz takes what they leave.
DATABASE_URL="$fuzz_db" REDIS_URL="$fuzz_redis" nice -n 10 .venv/bin/pytest -m fuzz -q \
  >"$fuzz_log" 2>&1 &
fuzz_pid=$!
status=0
"${pytest_parallel[@]}" -m "not fuzz" || status=$?
fuzz_status=0
wait "$fuzz_pid" || fuzz_status=$?
echo "== pytest -m fuzz"
cat "$fuzz_log"
rm -f "$fuzz_log"
mypy_report || status=$((status ? status : 1))
# pytest exits 5 when it collects nothing: a suite without fuzz tests is not a failure.
if [ "$fuzz_status" -ne 0 ] && [ "$fuzz_status" -ne 5 ]; then status=$fuzz_status; fi
exit "$status"
