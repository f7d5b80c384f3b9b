"""infraops/experiments/accelerators.py and the sandbox's side of it: a probe that requires a GPU
gets the
GPU's device nodes (and no other node of /dev) and no address-space limit, its memory bounded by
the memory control group; every probe gets the operator's toolchains read-only, their bin/ first
on PATH; a folder that would show the host's secrets or the service's files is refused in words.

On a host with a GPU the nodes are given for real (those tests skip elsewhere)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core.management.base import CommandError

from infraops.errors import DomainError
from infraops.experiments import accelerators, sandbox
from infraops.management.commands.standalone import Command as Standalone
from infraops.manifest import Probe
from tests.infraops.conftest import Dirs
from tests.infraops.experiments.test_sandbox import limits, python

IS_ROOT = os.geteuid() == 0
HAS_GPU = accelerators.host_has_gpu()
HAS_MEMORY_GROUP = "memory per sandbox" in sandbox.sandbox_containment()


def probe(*requires: str) -> Probe:
    return Probe(name="p", layer="performance", command="true", repeat=1, requires=requires)


@pytest.fixture
def toolchain() -> Iterator[Path]:
    """A toolchain folder the sandbox user can read, with one program in its bin/."""
    folder = Path(tempfile.mkdtemp(prefix="infraops-toolchain-"))
    folder.chmod(0o755)
    (folder / "bin").mkdir(mode=0o755)
    tool = folder / "bin" / "infraops-tool"
    tool.write_text("#!/bin/sh\necho tool from the toolchain\n")
    tool.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def run(dirs: Dirs, command: str, access: accelerators.ProbeAccess) -> sandbox.SandboxResult:
    return sandbox.sandbox_run(sandbox.SandboxSpec(
        command=command, workdir=dirs.work, out_dir=dirs.out, env={"PATH": access.path},
        devices=access.devices, readonly_binds=access.readonly_binds,
        limits=limits(address_space_mb=access.address_space_mb)),  # type: ignore[arg-type]
        identity=dirs.identity)


@pytest.mark.parametrize(("path", "says"), [
    ("/dev/null", "is not an accelerator device node"),
    ("/dev/mem", "is not an accelerator device node"),
    ("/dev/nvidia0/../sda", "is not an accelerator device node"),
    ("/dev/vda", "is not an accelerator device node"),
    ("/dev/nvidia9999", "does not exist"),
    ("/dev/dri/renderD9999", "does not exist"),
])
def test_only_existing_accelerator_nodes_can_be_given_to_a_probe(path: str, says: str) -> None:
    assert says in (sandbox.accelerator_device(Path(path)) or "")


def test_a_spec_giving_another_device_is_refused_before_anything_runs(dirs: Dirs) -> None:
    with pytest.raises(ValueError, match="/dev/null is not an accelerator device node"):
        sandbox.sandbox_run(sandbox.SandboxSpec(
            command="true", workdir=dirs.work, out_dir=dirs.out, env={},
            devices=[Path("/dev/null")]), identity=dirs.identity)


def test_patterns_match_accelerator_nodes_alone(monkeypatch: Any) -> None:
    # /dev/* matches the terminal, the disks and /dev/mem: none is ever given.
    found = accelerators.gpu_devices(["/dev/*", "/dev/dri/*"])
    assert all(sandbox.accelerator_device(device) is None for device in found), found
    assert Path("/dev/null") not in found


def test_a_probe_without_requirements_gets_no_device_and_keeps_its_address_space_limit(
        settings: Any) -> None:
    settings.SANDBOX_TOOLCHAINS = ()
    access = accelerators.probe_access(probe())
    assert access.devices == () and access.address_space_mb == 8192
    assert access.path == sandbox.SANDBOX_PATH


@pytest.mark.skipif(HAS_GPU, reason="this host has a GPU")
def test_a_gpu_probe_on_a_host_without_a_gpu_is_refused_in_words() -> None:
    with pytest.raises(DomainError, match="requires a GPU, and this worker's host has no GPU "
                                          "device node matching INFRAOPS_SANDBOX_GPU_DEVICES"):
        accelerators.probe_access(probe("gpu"))


def test_a_gpu_probe_gets_the_nodes_and_no_address_space_limit(monkeypatch: Any) -> None:
    nodes = [Path("/dev/nvidia0"), Path("/dev/nvidiactl"), Path("/dev/nvidia-uvm")]
    monkeypatch.setattr(accelerators, "gpu_devices", lambda patterns=None: nodes)
    access = accelerators.probe_access(probe("gpu"))
    assert access.devices == tuple(nodes) and access.address_space_mb is None
    # Control nodes alone are no GPU.
    monkeypatch.setattr(accelerators, "gpu_devices", lambda patterns=None: nodes[1:])
    with pytest.raises(DomainError, match="requires a GPU"):
        accelerators.probe_access(probe("gpu"))


@pytest.mark.skipif(not HAS_MEMORY_GROUP, reason="no memory control group here")
def test_without_an_address_space_limit_the_memory_group_still_bounds_the_probe(
        dirs: Dirs) -> None:
    # 64 GiB of address space reserved, never usable: what a GPU driver does at its start,
    # refused under RLIMIT_AS.
    reserve = python("import mmap; m = mmap.mmap(-1, 64 << 30, flags=mmap.MAP_PRIVATE "
                     "| mmap.MAP_ANONYMOUS, prot=0); print(len(m) >> 30)")
    unlimited = accelerators.ProbeAccess(address_space_mb=None)
    assert run(dirs, reserve, unlimited).stdout.strip() == b"64"
    assert run(dirs, reserve, accelerators.ProbeAccess()).reason == "memory-limit"
    # Touching more than the group allows is still stopped.
    hog = python("b = bytearray(3 << 30)")
    spec = sandbox.SandboxSpec(command=hog, workdir=dirs.work, out_dir=dirs.out, env={},
                               limits=limits(address_space_mb=None,  # type: ignore[arg-type]
                                             memory_mb=512))
    assert sandbox.sandbox_run(spec, identity=dirs.identity).reason == "memory-limit"


@pytest.mark.skipif(HAS_MEMORY_GROUP, reason="a memory control group is available here")
def test_without_a_memory_group_a_run_without_an_address_space_limit_is_refused(
        dirs: Dirs) -> None:
    with pytest.raises(sandbox.SandboxUnavailable, match="needs a memory control group"):
        run(dirs, "true", accelerators.ProbeAccess(address_space_mb=None))


def test_a_toolchain_is_bound_read_only_with_its_programs_first_on_path(
        dirs: Dirs, toolchain: Path, settings: Any) -> None:
    settings.SANDBOX_TOOLCHAINS = (str(toolchain),)
    access = accelerators.probe_access(probe())
    assert access.readonly_binds == ((toolchain, str(toolchain)),)
    assert access.path == f"{toolchain}/bin:{sandbox.SANDBOX_PATH}"

    result = run(dirs, f"infraops-tool && touch {toolchain}/bin/planted", access)
    assert result.stdout == b"tool from the toolchain\n"
    assert b"Read-only file system" in result.stderr
    assert not (toolchain / "bin" / "planted").exists()


@pytest.mark.parametrize("folder", ["/", "/tmp", "/etc", "/etc/ssl", "/root", "/var/lib",
                                    "/home", "relative/folder", "/nonexistent/toolchain"])
def test_a_toolchain_that_would_show_the_host_is_refused_in_words(
        folder: str, settings: Any) -> None:
    settings.SANDBOX_TOOLCHAINS = (folder,)
    with pytest.raises(DomainError, match=r"^INFRAOPS_SANDBOX_TOOLCHAINS: .+\.$"):
        accelerators.probe_access(probe())


def test_a_toolchain_holding_or_inside_the_service_files_is_refused(settings: Any) -> None:
    parent = Path(settings.BASE_DIR).parent  # (a clone in /tmp: refused as /tmp already)
    for folder in (settings.BASE_DIR, Path(settings.BASE_DIR) / "infraops", settings.DATA_DIR,
                   *([parent] if str(parent) not in ("/", "/tmp") else [])):
        settings.SANDBOX_TOOLCHAINS = (str(folder),)
        with pytest.raises(DomainError, match="the service's own files"):
            accelerators.probe_access(probe())


@pytest.mark.skipif(not HAS_GPU, reason="no GPU device node here")
def test_on_a_gpu_host_the_probe_sees_its_gpu_and_no_other_node(dirs: Dirs) -> None:
    access = accelerators.probe_access(probe("gpu"))
    result = run(dirs, "ls /dev; nvidia-smi -L", access)
    assert result.reason == "ok", result.stderr
    listed = set(result.stdout.decode().split())
    assert {device.name for device in access.devices if device.parent == Path("/dev")} <= listed
    assert not listed & {"vda", "sda", "nvme0", "mem", "kmsg", "kvm"}, listed
    assert b"GPU 0:" in result.stdout


def test_standalone_starts_a_gpu_worker_only_where_there_is_a_gpu() -> None:
    command = Standalone()
    assert command._gpu_worker("off") is False
    assert command._gpu_worker("auto") is HAS_GPU
    if not HAS_GPU:
        with pytest.raises(CommandError, match="--gpu on: this host has no GPU device node"):
            command._gpu_worker("on")
    assert settings.SANDBOX_GPU_DEVICES[0] == "/dev/nvidia[0-9]*"
