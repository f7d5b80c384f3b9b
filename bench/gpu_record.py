"""Record the demo's GPU probes on a machine with a CUDA GPU, the way a GPU worker runs them
(each execution in a fresh output folder, told its variant, seed and repeat), for the
analysis test that replays them where there is no GPU
(tests/infraops/experiments/test_gpu_probes.py).

    python3 bench/gpu_record.py OUT_DIR

OUT_DIR/<probe>/<side>/<variant>/<repeat>/ gets each execution's metrics.jsonl and outputs/,
with run.json (the command's exit status, seconds, environment) beside them. The merge probe
at each precision (both sides the demo as it is); the decode kernel tiled (the baseline) and
merged (the candidate).
Repeat -1 is the warm-up. Needs torch and triton; plain Python otherwise (no Django).
"""

import argparse
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time

DEMO = pathlib.Path(__file__).resolve().parent.parent / "examples" / "demo-kernels"
SEEDS = {-1: 7, 0: 11, 1: 12, 2: 13, 3: 14, 4: 15}


def execute(tree: pathlib.Path, command: str, env: dict[str, str], out: pathlib.Path) -> None:
    out.mkdir(parents=True)
    started = time.monotonic()
    result = subprocess.run(command, shell=True, cwd=tree, capture_output=True, text=True,
                            env=os.environ | env | {"INFRAOPS_OUT": str(out)}, timeout=600)
    (out / "run.json").write_text(json.dumps({
        "command": command, "env": env, "exit": result.returncode,
        "seconds": time.monotonic() - started, "stderr": result.stderr[-4000:]}))
    if result.returncode != 0:
        sys.stderr.write(f"{command} {env} failed:\n{result.stderr[-2000:]}\n")


def tree_with(name: str, file: str, pattern: str, value: str) -> pathlib.Path:
    """A copy of the demo with one knob set, as the side's commit would have it."""
    tree = pathlib.Path(tempfile.mkdtemp(prefix=f"demo-{name}-"))
    shutil.copytree(DEMO, tree, dirs_exist_ok=True)
    path = tree / file
    path.write_text(re.sub(pattern, value, path.read_text(), flags=re.M))
    return tree


def main(root: pathlib.Path) -> None:
    # The merge probe compares precisions within one commit: both sides are the demo as is.
    for side in ("baseline", "candidate"):
        for precision in ("tf32", "tf32x3", "ieee"):
            for repeat in (-1, 0):
                env = {"PRECISION": precision, "INFRAOPS_SEED": str(SEEDS[repeat]),
                       "INFRAOPS_REPEAT": str(max(repeat, 0))}
                execute(DEMO, "python3 bench/gpu_merge.py --outputs", env,
                        root / "gpu-cp-equivalence" / side / f"precision={precision}" / str(repeat))
    for side, merged in (("baseline", "False"), ("candidate", "True")):
        tree = tree_with(side, "kernel/tiling.py", r"^MERGE_TILES = \w+$",
                         f"MERGE_TILES = {merged}")
        for repeat in SEEDS:
            env = {"INFRAOPS_SEED": str(SEEDS[repeat]), "INFRAOPS_REPEAT": str(max(repeat, 0))}
            execute(tree, "python3 bench/gpu_decode.py", env,
                    root / "gpu-decode-bench" / side / "default" / str(repeat))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=pathlib.Path, help="OUT_DIR: where the executions go")
    main(parser.parse_args().out)
