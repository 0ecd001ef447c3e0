"""The host lines of a tuned profile's header, read from a /proc and /sys laid out in a
temporary tree (a second NUMA node and an NVIDIA driver are what this machine cannot have).
The GPU's name comes from torch, faked here for the same reason."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from kvcr_policy.memory import cuda
from kvcr_policy.memory.linux import use_roots
from kvcr_policy.tune.host import describe_host

DRIVER = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release Build  "
    "(dvs-builder@U16-I3-B03-4-3)  Thu Jan 16 00:00:00 UTC 2026\nGCC version:  gcc 12\n"
)


def _roots(tmp_path: Path) -> tuple[Path, Path]:
    proc, sys = tmp_path / "proc", tmp_path / "sys"
    (proc / "driver/nvidia").mkdir(parents=True)
    (proc / "cpuinfo").write_text("processor\t: 0\nmodel name\t: Intel(R)  Xeon(R) 8480+\n")
    (proc / "meminfo").write_text("MemTotal:       131072000 kB\nMemFree: 1 kB\n")
    (proc / "driver/nvidia/version").write_text(DRIVER)
    (sys / "devices/system/node").mkdir(parents=True)
    (sys / "devices/system/node/online").write_text("0-1\n")
    return proc, sys


def test_the_host_line_names_cpu_cores_memory_and_numa_nodes(tmp_path: Path) -> None:
    proc, sys = _roots(tmp_path)
    with use_roots(proc=proc, sys=sys):
        host = describe_host()
    line = host.lines()[0]
    assert line.startswith("host: Intel(R) Xeon(R) 8480+; ")
    assert "125.0 GiB memory; 2 NUMA nodes; Linux " in line
    assert host.gpu is None and len(host.lines()) == 1


def test_with_a_gpu_the_header_names_it_and_its_driver(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = SimpleNamespace(
        cuda=SimpleNamespace(get_device_name=lambda: "NVIDIA H200"),
        version=SimpleNamespace(cuda="12.8"),
    )
    monkeypatch.setattr(cuda, "require_cuda", lambda: fake)
    proc, sys = _roots(tmp_path)
    with use_roots(proc=proc, sys=sys):
        host = describe_host(gpu=True)
    assert host.lines()[1] == "gpu: NVIDIA H200; driver 570.86.15 (CUDA 12.8 in torch)"
    assert host.to_dict()["numa_nodes"] == 2
