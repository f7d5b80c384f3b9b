#!/usr/bin/env bash
# One progress line of scripts/setup.sh's package install: what pip is at in its current step.
#   scripts/pip-progress.sh LOG STEP_MARKER SITE SECONDS
# LOG is pip's output, where setup.sh writes "== step N of M: what" before each pip call;
# STEP_MARKER a file touched as that step began; SITE the folder the packages go into.
# Only the current step counts: the first step's "Installing collected packages: pip" made the
# second step's resolution read "installing, 2 of about 40 packages", and a package pip
# collected twice while it backtracked counted twice.
set -euo pipefail
log=$1 marker=$2 site=$3 seconds=$4

step=$(awk '/^== step /{text=""} {text=text $0 "\n"} END{printf "%s", text}' "$log")
title=$(head -n 1 <<<"$step" | sed -n 's/^== //p')
title=${title:-starting}
found=$( { grep -oE '^Collecting [A-Za-z0-9._-]+' <<<"$step" || true; } |
  awk '{name=tolower($2); gsub(/[-_.]+/, "-", name); print name}' | sort -u | wc -l)
collected=$( { grep '^Installing collected packages: ' <<<"$step" || true; } | tail -n 1)
if [ -n "$collected" ]; then
  total=$(sed 's/^Installing collected packages: //' <<<"$collected" | tr ',' '\n' | wc -l)
  installed=$(find "$site" -maxdepth 3 -name '*.dist-info' -newer "$marker" 2>/dev/null | wc -l)
  installed=$(( installed > total ? total : installed ))
  echo "  ... $seconds s: $title: installing, $installed of $total packages in place"
else
  echo "  ... $seconds s: $title: resolving, $found package$([ "$found" = 1 ] || echo s) found"
fi
