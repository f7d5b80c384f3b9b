"""Which host device nodes a probe may be given: accelerators only (:func:`accelerator_device`),
each bound over the sandbox's fresh /dev."""

from __future__ import annotations

import re
import stat
from pathlib import Path

from infraops.experiments.sandbox.config import SandboxSpec

# The device nodes a probe may be given: GPUs and their control, memory-manager and capability
# nodes (NVIDIA), the compute and render nodes of AMD and Intel GPUs, and accel nodes. Never
# /dev/mem, a disk, a terminal or the kernel log, whatever an operator's pattern matches.
_ACCELERATOR_DEVICE = re.compile(
    r"/dev/(nvidia(\d+|ctl|-uvm|-uvm-tools|-modeset)|nvidia-caps/nvidia-cap\d+|kfd"
    r"|dri/renderD\d+|accel/accel\d+)")


def accelerator_device(path: Path) -> str | None:
    """Why `path` cannot be given to a probe as an accelerator device; None when it can: one
    of the accelerator nodes above, a character device, not a symlink."""
    if not _ACCELERATOR_DEVICE.fullmatch(str(path)):
        return f"{path} is not an accelerator device node (GPU, compute or render node)"
    try:
        info = path.lstat()
    except OSError:
        return f"{path} does not exist"
    if not stat.S_ISCHR(info.st_mode):
        return f"{path} is not a character device"
    return None


def _device_args(spec: SandboxSpec) -> list[str]:
    """The accelerator nodes, over the fresh /dev (bwrap makes the parent folders)."""
    args: list[str] = []
    for device in spec.devices:
        args += ["--dev-bind", str(device), str(device)]
    return args
