"""The host a profile was tuned on, as its header records it.

CPU model and memory come from ``/proc`` (through :func:`~kvcr_policy.memory.linux.proc_root`,
so tests can point it elsewhere), NUMA nodes from ``/sys``
(:func:`~kvcr_policy.memory.linux.online_nodes`), the GPU from torch and its driver from
``/proc/driver/nvidia/version`` (written by the NVIDIA kernel module; absent elsewhere).
"""

from __future__ import annotations

import os
import platform
import re
from dataclasses import dataclass
from typing import Any

from ..memory.linux import online_nodes, proc_root

__all__ = ["Host", "describe_host"]

_DRIVER = re.compile(r"Kernel Module\s+(?:for\s+\S+\s+)?([0-9][0-9.]*)")


@dataclass(frozen=True, slots=True)
class Host:
    cpu: str
    cores: int
    memory_gib: float
    numa_nodes: int
    kernel: str
    gpu: str | None = None
    gpu_driver: str | None = None

    def lines(self) -> list[str]:
        """The header's host lines."""
        nodes = f"{self.numa_nodes} NUMA node{'s' if self.numa_nodes != 1 else ''}"
        found = [
            f"host: {self.cpu}; {self.cores} cores; {self.memory_gib:.1f} GiB memory; {nodes}; "
            f"Linux {self.kernel}"
        ]
        if self.gpu is not None:
            found.append(f"gpu: {self.gpu}; driver {self.gpu_driver or 'unknown'}")
        return found

    def to_dict(self) -> dict[str, Any]:
        return {
            "cpu": self.cpu,
            "cores": self.cores,
            "memory_gib": round(self.memory_gib, 1),
            "numa_nodes": self.numa_nodes,
            "kernel": self.kernel,
            "gpu": self.gpu,
            "gpu_driver": self.gpu_driver,
        }


def _read(name: str) -> str:
    try:
        return (proc_root() / name).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _field(text: str, key: str) -> str | None:
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip() == key:
            return value.strip()
    return None


def _gpu() -> tuple[str, str | None]:
    from ..memory.cuda import require_cuda

    torch = require_cuda()
    match = _DRIVER.search(_read("driver/nvidia/version"))
    driver = match.group(1) if match else None
    cuda = getattr(torch.version, "cuda", None)
    if cuda:
        driver = f"{driver or 'unknown'} (CUDA {cuda} in torch)"
    return torch.cuda.get_device_name(), driver


def describe_host(gpu: bool = False) -> Host:
    """This host; with ``gpu``, the current CUDA device too."""
    cpuinfo = _read("cpuinfo")
    model = _field(cpuinfo, "model name") or platform.processor() or "unknown CPU"
    kib = _field(_read("meminfo"), "MemTotal")
    memory = int(kib.split()[0]) / 2**20 if kib else 0.0
    name, driver = _gpu() if gpu else (None, None)
    return Host(
        cpu=re.sub(r"\s+", " ", model),
        cores=os.cpu_count() or 1,
        memory_gib=memory,
        numa_nodes=max(1, len(online_nodes())),
        kernel=platform.release(),
        gpu=name,
        gpu_driver=driver,
    )
