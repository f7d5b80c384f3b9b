"""What a probe execution may use of its worker's host beyond the bare sandbox: the GPU's
device nodes, for probes that require "gpu", and the operator's toolchains (a Python
environment with torch and Triton, a CUDA toolkit), read-only, for every probe.

A GPU worker is an ordinary worker that consumes the experiments.gpu queue on a host with a GPU
(docs/gpu.md). Its probes run in the same sandbox as any other, as the sandbox user, with every
namespace unshared; they get the accelerator nodes that INFRAOPS_SANDBOX_GPU_DEVICES matches
(never another node of /dev: infraops.experiments.sandbox.accelerator_device) and no
address-space limit (a GPU driver reserves more than any sensible one), their memory bounded by
the memory control group instead.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from infraops.errors import DomainError
from infraops.experiments import sandbox
from infraops.manifest import Probe

GPU = "gpu"
# Folders a toolchain may not be: the whole host or its shared scratch folder; nor be inside,
# or hold: the host's secrets, its devices, the service's state and the databases' files.
_NOT_A_TOOLCHAIN = ("/", "/tmp")  # noqa: S108  # nosec B108 (names refused, never written)
_NEVER_SHOWN = ("/etc", "/root", "/home", "/proc", "/sys", "/dev", "/run", "/var", "/boot")


@dataclass(frozen=True)
class ProbeAccess:
    """The host's devices and folders one probe execution gets, and the PATH it runs with."""

    devices: tuple[Path, ...] = ()
    readonly_binds: tuple[tuple[Path, str], ...] = ()
    path: str = sandbox.SANDBOX_PATH
    address_space_mb: int | None = sandbox.SandboxLimits().address_space_mb
    environment: tuple[tuple[str, str], ...] = ()  # what the probe is told of its devices


def gpu_devices(patterns: Sequence[str] | None = None) -> list[Path]:
    """The accelerator device nodes on this host that the patterns match (default: the
    setting), sorted; anything else a pattern matches is left out."""
    found: set[Path] = set()
    for pattern in settings.SANDBOX_GPU_DEVICES if patterns is None else patterns:
        for path in Path("/").glob(pattern.lstrip("/")):
            if sandbox.accelerator_device(path) is None:
                found.add(path)
    return sorted(found)


def toolchain_problem(folder: Path) -> str | None:
    """Why `folder` cannot be bound into every sandbox; None when it can."""
    if not folder.is_absolute():
        return f"{folder} is not an absolute path"
    real = Path(os.path.realpath(folder))
    if not real.is_dir():
        return f"{folder} is not a folder on this host"
    if str(real) in _NOT_A_TOOLCHAIN:
        return f"{folder} is {real}, not a toolchain's own folder"
    if any(real.is_relative_to(top) for top in _NEVER_SHOWN):
        return f"{folder} is inside {_top(real)}, which the sandbox never shows"
    for secret in (Path(settings.DATA_DIR), Path(settings.BASE_DIR)):
        secret = Path(os.path.realpath(secret))
        if real == secret or real.is_relative_to(secret) or secret.is_relative_to(real):
            return f"{folder} holds or is inside the service's own files ({secret})"
    return None


def _top(path: Path) -> str:
    return "/" + path.parts[1] if len(path.parts) > 1 else "/"


def toolchains() -> list[Path]:
    """The operator's toolchain folders (INFRAOPS_SANDBOX_TOOLCHAINS), resolved. DomainError
    naming the first that cannot be bound: a probe then fails with that sentence rather than
    run without the tools it was promised."""
    chosen = []
    for folder in settings.SANDBOX_TOOLCHAINS:
        problem = toolchain_problem(Path(folder))
        if problem:
            raise DomainError(f"INFRAOPS_SANDBOX_TOOLCHAINS: {problem}.")
        chosen.append(Path(os.path.realpath(folder)))
    return chosen


def probe_access(probe: Probe) -> ProbeAccess:
    """What one execution of `probe` gets: the toolchains (their bin/ first on PATH) for every
    probe, and for a probe that requires a GPU the GPU's nodes without an address-space limit.
    DomainError when the probe requires a GPU and this host has none to give it."""
    folders = toolchains()
    binds = tuple((folder, str(folder)) for folder in folders)
    bins = [str(folder / "bin") for folder in folders if (folder / "bin").is_dir()]
    path = ":".join([*bins, sandbox.SANDBOX_PATH])
    if GPU not in probe.requires:
        return ProbeAccess(readonly_binds=binds, path=path)
    devices = own_gpus(gpu_devices())
    if not any(_is_gpu(device) for device in devices):
        patterns = ", ".join(settings.SANDBOX_GPU_DEVICES) or "(none)"
        raise DomainError(
            f"Probe {probe.name!r} requires a GPU, and this worker's host has no GPU device "
            f"node matching INFRAOPS_SANDBOX_GPU_DEVICES ({patterns}): run it on a GPU worker "
            "(celery -A infraops.project worker -Q experiments.gpu on a host with a GPU).")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    told = (("CUDA_VISIBLE_DEVICES", visible),) if visible is not None else ()
    return ProbeAccess(devices=tuple(devices), readonly_binds=binds, path=path,
                       address_space_mb=None, environment=told)


def own_gpus(devices: Sequence[Path], visible: str | None = None) -> list[Path]:
    """`devices` less the NVIDIA GPUs this worker was not given: a worker per GPU
    (CUDA_VISIBLE_DEVICES=N each, manage.py gpu_workers) hands its probes /dev/nvidiaN and
    the control nodes, never another worker's GPU. A list that names a GPU by UUID cannot be
    mapped to nodes: all are kept, and CUDA_VISIBLE_DEVICES, passed on, still chooses."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES") if visible is None else visible
    if visible is None:
        return list(devices)
    indices = [v.strip() for v in visible.split(",") if v.strip()]
    if not all(index.isdigit() for index in indices):
        return list(devices)
    return [d for d in devices
            if not (d.name.startswith("nvidia") and d.name[6:].isdigit())
            or d.name[6:] in indices]


def _is_gpu(device: Path) -> bool:
    """A node that is a GPU itself, not only a control node beside one."""
    name = device.name
    return ((name.startswith("nvidia") and name[6:].isdigit()) or name == "kfd"
            or name.startswith(("renderD", "accel")))


def host_has_gpu() -> bool:
    """Whether this host has a GPU node a probe could be given (standalone's --gpu auto)."""
    return any(_is_gpu(device) for device in gpu_devices())
