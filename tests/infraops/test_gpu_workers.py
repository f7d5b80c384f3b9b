"""manage.py gpu_workers: a worker per GPU, on the queues that probes requiring it land on."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from infraops.experiments import accelerators
from infraops.experiments.services import queue_for
from infraops.management.commands import gpu_workers
from infraops.manifest import Probe

H200 = {"kind": "gpu", "model": "NVIDIA H200", "memory_mib": 143771, "driver": "570",
        "index": 0}


def probe(*requires: str) -> Probe:
    return Probe(name="p", layer="bench", command="true", repeat=5, requires=requires)


def test_each_gpu_gets_a_worker_of_its_own_on_the_queues_its_probes_use() -> None:
    second = {**H200, "index": 1}
    workers = gpu_workers.plan([H200, second], host="node7", extra_queues=["experiments"])
    assert [w.name for w in workers] == ["gpu0@node7", "gpu1@node7"]
    assert [dict(w.env) for w in workers] == [{"CUDA_VISIBLE_DEVICES": "0"},
                                              {"CUDA_VISIBLE_DEVICES": "1"}]
    for worker in workers:
        argv = list(worker.argv)
        assert argv[argv.index("-c") + 1] == "1"
        assert queue_for([probe("gpu")]) in worker.queues
        assert queue_for([probe("gpu", "h200")]) in worker.queues
        assert queue_for([probe("gpu", "a100")]) not in worker.queues
        assert "experiments" in worker.queues


def test_a_model_that_sorts_before_gpu_still_meets_its_probes() -> None:
    a100 = {**H200, "model": "NVIDIA A100-SXM4-80GB"}
    (worker,) = gpu_workers.plan([a100], host="h", extra_queues=[])
    assert worker.queues == ("experiments.gpu", "experiments.a100.gpu")
    assert queue_for([probe("gpu", "a100")]) in worker.queues


def test_a_worker_per_gpu_hands_its_probes_only_its_own_gpu(tmp_path: Path) -> None:
    nodes = [Path("/dev/nvidiactl"), Path("/dev/nvidia-uvm"), Path("/dev/nvidia0"),
             Path("/dev/nvidia1"), Path("/dev/nvidia12")]
    assert accelerators.own_gpus(nodes, "1") == [Path("/dev/nvidiactl"),
                                                 Path("/dev/nvidia-uvm"), Path("/dev/nvidia1")]
    assert accelerators.own_gpus(nodes, "0,12") == [Path("/dev/nvidiactl"),
                                                    Path("/dev/nvidia-uvm"), Path("/dev/nvidia0"),
                                                    Path("/dev/nvidia12")]
    # Named by UUID: cannot be mapped to nodes, CUDA_VISIBLE_DEVICES alone chooses.
    assert accelerators.own_gpus(nodes, "GPU-5d1c") == nodes


def test_without_a_gpu_the_command_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu_workers, "accelerators", list)
    with pytest.raises(CommandError, match="No GPU found"):
        call_command("gpu_workers", "--print")


def test_print_shows_the_workers_and_starts_nothing(monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(gpu_workers, "accelerators", lambda: [H200])
    monkeypatch.setattr(gpu_workers.Command, "_supervise",
                        lambda self, workers: pytest.fail("started workers"))
    call_command("gpu_workers", "--print", "--queues", "experiments")
    out = capsys.readouterr().out
    assert "CUDA_VISIBLE_DEVICES=0" in out
    assert "-Q experiments.gpu,experiments.gpu.h200,experiments" in out
