"""Record the flash-linear-attention probes on a machine with a CUDA GPU, at every point of
their targets' knob space, the way a GPU worker runs them (each execution a fresh process in a
fresh output folder, told its seed and repeat), for the analysis test that replays them where
there is no GPU (tests/infraops/experiments/test_fla_replay.py) and for the figures of
docs/gpu.md.

    python3 bench/fla_record.py OUT_DIR [--repeats 5] [--only fla-kda] [--point bv=32,num_warps=4]

The targets' trees are built as `manage.py load_example` builds them (the installed fla-core's
own files, infraops/example_sources.py), once per configuration with the knob values written
in. OUT_DIR/<probe>/<configuration>/<repeat>/ gets each execution's metrics.jsonl and run.json
(exit status, seconds, stderr's end); OUT_DIR/record.json the configurations and the figures.
Prints `figure:` lines: each configuration's decode time per batch against the release's, and
the merge's error at each length per precision. Needs torch, triton and fla-core; no Django.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from infraops.example_sources import source_read, tree_build  # noqa: E402

EXAMPLES = ROOT / "examples"
SEEDS = (11, 12, 13, 14, 15, 16, 17, 18)
PROBES = {"fla-kda": ("kda-decode", "python3 bench/kda_decode.py"),
          "fla-cp": ("cp-merge", "python3 bench/cp_merge.py")}
# The merge's errors are deterministic for a seed: three executions say as much as five.
MOST_REPEATS = {"cp-merge": 3}
RELEASE = {"fla-kda": {"bv": "32", "num_warps": "4"}, "fla-cp": {"cp_dot_precision": "tf32"}}


def knob_space(example: str) -> tuple[list[dict[str, str]], list[dict[str, Any]]]:
    knobs = tomllib.loads((EXAMPLES / example / "infraops.toml").read_text())["knob"]
    space: list[dict[str, str]] = [{}]
    for knob in knobs:
        space = [point | {knob["name"]: str(value)} for point in space
                 for value in knob["values"]]
    return space, knobs


def label(point: dict[str, str]) -> str:
    return "-".join(f"{name}={value}" for name, value in point.items())


def tree_for(example: str, knobs: list[dict[str, Any]], point: dict[str, str]) -> Path:
    folder = EXAMPLES / example
    source = source_read(folder)
    assert source is not None, f"{folder} has no source.toml"
    tree = Path(tempfile.mkdtemp(prefix=f"{example}-"))
    tree_build(example=folder, source=source, dest=tree)
    for knob in knobs:
        path = tree / knob["file"]
        text = path.read_text()
        match = re.search(knob["pattern"], text, flags=re.M)
        assert match is not None, f"knob {knob['name']} matches nothing in {knob['file']}"
        path.write_text(text[:match.start(1)] + point[knob["name"]] + text[match.end(1):])
    return tree


def execute(tree: Path, command: str, seed: int, repeat: int, out: Path) -> bool:
    out.mkdir(parents=True)
    env = os.environ | {"INFRAOPS_OUT": str(out), "INFRAOPS_SEED": str(seed),
                        "INFRAOPS_REPEAT": str(repeat)}
    started = time.monotonic()
    result = subprocess.run(command, shell=True, cwd=tree, capture_output=True, text=True,
                            env=env, timeout=600)
    (out / "run.json").write_text(json.dumps({
        "command": command, "seed": seed, "repeat": repeat, "exit": result.returncode,
        "seconds": round(time.monotonic() - started, 2), "stderr": result.stderr[-4000:]}))
    if result.returncode != 0:
        sys.stderr.write(f"{command} ({out}) failed:\n{result.stderr[-2000:]}\n")
    return result.returncode == 0


def rows(folder: Path) -> list[dict[str, Any]]:
    found = []
    for path in sorted(folder.glob("*/metrics.jsonl")):
        found += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return found


def medians(found: list[dict[str, Any]]) -> dict[tuple[str, str], float]:
    values: dict[tuple[str, str], list[float]] = defaultdict(list)
    for row in found:
        values[(row["name"], row.get("case", ""))].append(row["value"])
    return {key: statistics.median(v) for key, v in values.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--repeats", type=int, default=5, choices=range(1, len(SEEDS) + 1))
    parser.add_argument("--only", choices=sorted(PROBES), action="append")
    parser.add_argument("--point", action="append", default=[], metavar="KNOB=V[,KNOB=V]",
                        help="Only these configurations, in this order (default: all).")
    args = parser.parse_args()
    record: dict[str, Any] = {"configurations": {}, "figures": []}
    failed = 0
    for example in args.only or sorted(PROBES):
        probe, command = PROBES[example]
        space, knobs = knob_space(example)
        asked = [dict(pair.split("=", 1) for pair in p.split(",")) for p in args.point]
        if asked:
            space = [point for point in asked if point in space]
        for point in space:
            tree = tree_for(example, knobs, point)
            try:
                for repeat in range(min(args.repeats, MOST_REPEATS.get(probe, args.repeats))):
                    out = args.out / probe / label(point) / str(repeat)
                    failed += not execute(tree, command, SEEDS[repeat], repeat, out)
            finally:
                shutil.rmtree(tree, ignore_errors=True)
            record["configurations"].setdefault(probe, []).append(point)
    record["figures"] = figures(args.out)
    (args.out / "record.json").write_text(json.dumps(record, indent=2))
    for name, value, unit in record["figures"]:
        print(f"figure: {name} {value:.6g} {unit}")
    return 1 if failed else 0


def figures(out: Path) -> list[tuple[str, float, str]]:
    found: list[tuple[str, float, str]] = []
    kda = out / "kda-decode"
    if kda.is_dir():
        release = medians(rows(kda / label(RELEASE["fla-kda"])))
        for config in sorted(p.name for p in kda.iterdir()):
            measured = medians(rows(kda / config))
            for (name, _case), value in sorted(measured.items()):
                if name.startswith("decode_us_b") and release.get((name, "")):
                    ratio = value / release[(name, "")]
                    found.append((f"kda_{config}_{name}_vs_release", ratio, "ratio"))
            for (name, case), value in sorted(measured.items()):
                if name in ("registers", "spills", "programs_per_head") and case.endswith(
                        "b64-h32-bf16"):
                    found.append((f"kda_{config}_{name}_b64_h32_bf16", value, "count"))
            found.append((f"kda_{config}_max_err_ratio",
                          measured.get(("max_err_ratio", ""), float("nan")), "ratio"))
    cp = out / "cp-merge"
    if cp.is_dir():
        for config in sorted(p.name for p in cp.iterdir()):
            measured = medians(rows(cp / config))
            for (name, case), value in sorted(measured.items()):
                if name in ("rel_error", "merge_us"):
                    found.append((f"cp_{config}_{name}_{case}", value,
                                  "ratio" if name == "rel_error" else "us"))
            found.append((f"cp_{config}_slowest_retention",
                          measured.get(("slowest_retention", ""), float("nan")), "ratio"))
    return found


if __name__ == "__main__":
    sys.exit(main())
