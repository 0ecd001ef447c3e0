"""Where a pool's device sits, and what ``placement.numa_policy = "gpu"`` makes of it.

A GPU is a PCI device, and sysfs says which NUMA node it is attached to
(``/sys/bus/pci/devices/<address>/numa_node``, read through :mod:`~kvcr_policy.memory.linux`, so
tests fake a multi-node host with ``KVCR_POLICY_SYS_ROOT``). A copy transport locates the device
of each pool it serves (``Transport.locate`` of the ``dram`` copy engines); the backend hands
that to the placement strategy, and ``numa_policy = "gpu"`` turns it into a policy on the node
of that pool's GPU:

- ``numa_mode = "prefer"``: ``MPOL_PREFERRED`` on that node (the kernel takes other nodes when
  it is full; the audit's ``pages_per_node`` shows where pages landed, and stray pages are a
  recorded fallback);
- ``numa_mode = "require"``: ``MPOL_BIND`` on that node (pages land there or the region fails).

When there is nothing to be near (a pool in host memory, or a GPU whose platform reports no
node: ``numa_node`` is -1 on single-node hosts and in most VMs) the tier is left unbound, the
audit says why, and a warning says so once per process. ``require`` fails there only when the
host has more than one online node, where the missing node really leaves placement to chance.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

from kvcr_policy.errors import PlacementError

from . import linux as _os

__all__ = ["DeviceLocality", "NearPlacement", "locate", "near_placement", "pci_address"]

_LOG = logging.getLogger("kvcr_policy.memory.locality")
_said: set[str] = set()  # reasons already said in this process (said once, not per region)
_said_lock = threading.Lock()


@dataclass(frozen=True, slots=True)
class DeviceLocality:
    """One device and its NUMA node; ``node`` is None when none is known (``source`` says why)."""

    device: str  # "cuda:1"
    pci_address: str | None  # "0000:3b:00.0"
    node: int | None
    source: str  # the sysfs file the node was read from, or why there is none

    def describe(self) -> str:
        where = f" (PCI {self.pci_address})" if self.pci_address else ""
        if self.node is not None:
            return f"{self.device}{where} on NUMA node {self.node}"
        return f"{self.device}{where}: {self.source}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "pci_address": self.pci_address,
            "numa_node": self.node,
            "source": self.source,
        }


def pci_address(domain: int, bus: int, device: int, function: int = 0) -> str:
    """The sysfs name of a PCI function, ``dddd:bb:dd.f`` in lower-case hex."""
    return f"{domain:04x}:{bus:02x}:{device:02x}.{function:x}"


def locate(device: str, address: str | None) -> DeviceLocality:
    """The NUMA node of ``device`` at PCI ``address``, from sysfs."""
    if address is None:
        return DeviceLocality(device, None, None, "no PCI address known for it")
    path = _os.sys_root() / "bus/pci/devices" / address / "numa_node"
    node = _os.pci_numa_node(address)
    if node is None:
        return DeviceLocality(device, address, None, f"{path} is not readable")
    if node < 0:
        return DeviceLocality(device, address, None, f"no NUMA node reported ({path} is {node})")
    return DeviceLocality(device, address, node, str(path))


@dataclass(frozen=True, slots=True)
class NearPlacement:
    """What ``numa_policy = "gpu"`` becomes for one region: a tier policy, and why."""

    policy: str  # "preferred" | "bind" | "none"
    nodes: tuple[int, ...]
    note: str  # the audit's ``numa_near``


def near_placement(name: str, device: DeviceLocality | None, mode: str) -> NearPlacement:
    """The policy that puts region ``name`` near ``device``; see the module docstring."""
    if device is not None and device.node is not None:
        policy = "bind" if mode == "require" else "preferred"
        return NearPlacement(policy, (device.node,), f"gpu: {device.describe()}")
    what = "a host pool, no GPU to be near" if device is None else device.describe()
    online = _os.online_nodes()
    if mode == "require" and len(online) > 1:
        message = (
            f"tier {name!r}: placement.numa_policy 'gpu' (numa_mode 'require') needs the NUMA "
            f"node of its pool's GPU, but it serves {what}, on a host with nodes "
            f"{_os.format_node_list(online)}; name the node (numa_policy = 'bind', numa_nodes = "
            "[N]) or use numa_mode = 'prefer'"
        )
        raise PlacementError(message)
    note = f"gpu: {what}; tier left unbound"
    reason = "host" if device is None else "no node"
    with _said_lock:
        first = reason not in _said
        _said.add(reason)
    if first:
        _LOG.warning(
            "placement.numa_policy 'gpu': %s; tiers are left unbound (said once per process)",
            what,
        )
    return NearPlacement("none", (), note)
