#!/usr/bin/env bash
# Set-up shared by the README's two commands: Debian packages, the sandbox user, the venv.
# Idempotent: a second run installs nothing new.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v bwrap >/dev/null || need_apt+=(bubblewrap)
command -v chromium >/dev/null || need_apt+=(chromium)
command -v git >/dev/null || need_apt+=(git)
python3 -c 'import venv, ensurepip' 2>/dev/null || need_apt+=(python3-venv)
# Probes run the system's python3 inside the sandbox; correctness probes write .npy outputs.
/usr/bin/python3 -c 'import numpy' 2>/dev/null || need_apt+=(python3-numpy)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "Installing Debian packages: ${need_apt[*]}"
  # Another apt-get at work (a second set-up beside this one) holds dpkg's lock: wait for it.
  wait_lock=(-o DPkg::Lock::Timeout=600)
  apt-get "${wait_lock[@]}" update -qq
  DEBIAN_FRONTEND=noninteractive apt-get "${wait_lock[@]}" install -y -qq "${need_apt[@]}" >/dev/null
fi

# Probes run as this dedicated non-root user inside bubblewrap (docs/product.md, "Sandbox").
id -u infraops-sandbox >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin infraops-sandbox

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
stamp=.venv/.requirements-$(cat requirements.txt requirements-dev.txt requirements-gpu.txt | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ]; then
  echo "Installing Python packages into .venv (about two minutes the first time; log: .venv/pip.log)"
  step_marker=.venv/.pip-step
  # Each step says where it begins, in the log and by a marker's time (scripts/pip-progress.sh).
  step() { echo "== step $1 of 3: $2"; touch "$step_marker"; }
  { step 1 "pip itself" && .venv/bin/pip install --progress-bar off --upgrade pip &&
    step 2 "the pinned packages" &&
    # --no-compile: byte-compiling every installed module took 25 of this step's 43 s; Python
    # compiles what a process imports on first use and caches it (both README commands let
    # it write its bytecode cache).
    .venv/bin/pip install --progress-bar off --no-compile -r requirements-dev.txt &&
    # The release the FLA examples are built from (examples/*/source.toml), files only: a
    # separate call, since hash-checking mode cannot mix with the unhashed files above.
    step 3 "the FLA release" &&
    .venv/bin/pip install --progress-bar off --no-compile --require-hashes --no-deps \
      -r requirements-gpu.txt
  } > .venv/pip.log 2>&1 &
  pip_pid=$!
  started=$SECONDS
  report=10
  # What pip is at, every 10 s: a silent minute and a half looks like a hang.
  while kill -0 "$pip_pid" 2>/dev/null; do
    sleep 1
    if (( SECONDS - started >= report )); then
      report=$((report + 10))
      scripts/pip-progress.sh .venv/pip.log "$step_marker" .venv/lib $((SECONDS - started))
    fi
  done
  if ! wait "$pip_pid"; then
    tail -n 30 .venv/pip.log >&2
    exit 1
  fi
  echo "  Python packages installed in $((SECONDS - started)) s"
  rm -f .venv/.requirements-* && touch "$stamp"
fi

# The sandbox supervisor in C (without it, the sandbox falls back to the same program in Python,
# infraops/experiments/sandbox/supervisor.py).
supervisor=.venv/bin/infraops-sandbox-supervisor
if [ ! -x "$supervisor" ] || [ infraops/experiments/sandbox/supervisor.c -nt "$supervisor" ]; then
  if command -v cc >/dev/null; then
    cc -O2 -Wall -Wextra -Werror -o "$supervisor" infraops/experiments/sandbox/supervisor.c
  else
    echo "No C compiler: probes start through the slower Python supervisor." >&2
  fi
fi
