"""What this host's NUMA topology is, so NUMA tests expect what the host can give.

Tests must pass on a host with one node or many: a node they bind to is one where this process's
memory really lands, and a node they expect refused is one the kernel does not have. Topologies
this host lacks are faked with a temporary /sys tree (:func:`fake_sys_nodes`).
"""

from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np

from kvcr_policy.memory import linux as _os

__all__ = ["absent_node", "fake_sys_nodes", "home_node", "real_nodes"]


def real_nodes() -> tuple[int, ...]:
    """The nodes the kernel reports online, read from the real /sys whatever roots are set."""
    online = Path("/sys/devices/system/node/online")
    return _os.parse_node_list(online.read_text()) if online.exists() else (0,)


def home_node() -> int:
    """The node a freshly touched page of this process lands on (it has memory)."""
    mm = mmap.mmap(-1, _os.page_size())
    try:
        view = np.frombuffer(mm, dtype=np.uint8)
        view[0] = 1
        status = int(_os.move_pages_query([view.ctypes.data])[0])
        del view
    finally:
        mm.close()
    return status if status >= 0 else real_nodes()[0]


def absent_node() -> int:
    """A node number the kernel does not have: one past the highest online node."""
    return max(real_nodes()) + 1


def fake_sys_nodes(root: Path, nodes: tuple[int, ...]) -> Path:
    """Write a /sys tree under ``root`` whose node directory lists ``nodes`` online."""
    node_dir = root / "devices/system/node"
    for node in nodes:
        (node_dir / f"node{node}").mkdir(parents=True, exist_ok=True)
    (node_dir / "online").write_text(_os.format_node_list(nodes) + "\n")
    return root
