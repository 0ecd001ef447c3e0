"""Placed memory: what every backend that keeps pages in host memory builds on.

- ``region``: :class:`Region`, one process-owned anonymous mapping with huge-page advice, NUMA
  policy and pre-fault applied as asked, and :class:`PlacementAudit`, where its pages landed;
  :func:`open_region` makes one (the placement strategy calls it).
- ``locality``: :class:`DeviceLocality`, where a GPU sits (its PCI address and NUMA node), and
  the ``numa_policy = "gpu"`` plan built from it.
- ``linux``: the one thin layer over the Linux kernel's memory interfaces (syscalls, ``/proc``,
  ``/sys``), raising :class:`~kvcr_policy.errors.OsCallError`.
- ``headroom``: how much memory this process can really get (its memory cgroup, v1 or v2, the
  host's ``MemAvailable``, ``RLIMIT_AS``) and which limit binds, read through ``linux``'s roots.
- ``preflight``: a tier held to that before it is mapped, refused with
  :class:`~kvcr_policy.errors.TierMemoryError` naming ``placement.capacity_bytes`` and the fix.
- ``cuda``: :func:`require_cuda`, torch once a CUDA device is known to be visible.
- ``audit_text``: the human table of an audit (``kvcr-policy audit``).
- ``cpus``: the CPUs this process's threads may use together, and a thread moved onto them:
  threads and the host tier kvcr_policy starts never inherit the one core an engine pinned
  the starting thread to.

The ``dram`` backend, the peer server's tiers and plugin backends (``kvcr``) open regions
through the placement strategy (``dram`` and ``serve`` after ``preflight``); ``audit``, ``plan``
and ``tune`` read the host through ``linux`` and ``headroom``. Nothing here imports a backend.
"""

from .locality import DeviceLocality
from .region import PlacementAudit, Region, open_region

__all__ = ["DeviceLocality", "PlacementAudit", "Region", "open_region"]
