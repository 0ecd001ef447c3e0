"""Placement near the GPU: the NUMA node of a pool's device, and ``numa_policy = "gpu"``.

This host has one NUMA node and no GPU, so the topologies are faked, and the tests say so:
a temporary /sys tree (``KVCR_POLICY_SYS_ROOT`` through ``_os.use_roots``) lists two online
nodes and PCI devices whose ``numa_node`` files put GPUs on node 0, on node 1, or on none
(-1, as on a single-node host or a VM), and a memory transport stands in for the cuda one by
locating its pools on those GPUs. The kernel stays real: binding to the node this process's
memory lands on really binds, and binding to a node the kernel lacks is really refused.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvcr_policy.backends.base import BackendContext, Endpoint, PoolSpec
from kvcr_policy.backends.dram.backend import DramBackend
from kvcr_policy.backends.dram.store import Store
from kvcr_policy.backends.dram.transports.memory import MemoryTransport
from kvcr_policy.builtin.placement import AnonymousPlacement
from kvcr_policy.config.loading import load_config
from kvcr_policy.config.schema import PlacementSection
from kvcr_policy.errors import ConfigError, PlacementError
from kvcr_policy.geometry import PoolGeometry
from kvcr_policy.memory import linux as _os
from kvcr_policy.memory import locality
from kvcr_policy.memory.locality import DeviceLocality, locate, near_placement, pci_address
from kvcr_policy.pipeline import build_pipeline
from kvcr_policy.registry import NoOptions
from tests.support.hosts import absent_node, fake_sys_nodes, home_node, real_nodes

MIB = 1 << 20
LOGGER = "kvcr_policy.memory.locality"
#: Faked GPUs: PCI address -> the numa_node file's text.
GPUS = {"0000:3b:00.0": "0", "0000:d8:00.0": "1", "0000:5e:00.0": "-1"}
needs_numa = pytest.mark.skipif(not _os.has_numa_syscalls(), reason="NUMA syscalls unavailable")


def fake_gpus(root: Path, nodes: tuple[int, ...], gpus: dict[str, str]) -> Path:
    """Faked (this host has one node and no GPU): a /sys with ``nodes`` online and ``gpus``."""
    fake_sys_nodes(root, nodes)
    for address, node in gpus.items():
        device = root / "bus/pci/devices" / address
        device.mkdir(parents=True)
        (device / "numa_node").write_text(f"{node}\n")
    return root


@pytest.fixture
def two_nodes(tmp_path: Path) -> Iterator[Path]:
    """Faked: nodes 0 and 1 online, a GPU on each and one that reports no node."""
    with _os.use_roots(sys=fake_gpus(tmp_path, (0, 1), GPUS)):
        yield tmp_path


@pytest.fixture(autouse=True)
def unsaid(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts in a process that has said nothing yet."""
    monkeypatch.setattr(locality, "_said", set())


def _said(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


def test_pci_address_is_the_sysfs_name() -> None:
    assert pci_address(0, 0x3B, 0) == "0000:3b:00.0"
    assert pci_address(0x10000, 0xD8, 0x1F, 1) == "10000:d8:1f.1"


def test_locate_reads_each_gpu_node_from_sysfs(two_nodes: Path) -> None:
    on_0, on_1, none = (locate(f"cuda:{i}", a) for i, a in enumerate(GPUS))
    assert (on_0.node, on_1.node, none.node) == (0, 1, None)
    assert on_1.source == str(two_nodes / "bus/pci/devices/0000:d8:00.0/numa_node")
    assert on_1.describe() == "cuda:1 (PCI 0000:d8:00.0) on NUMA node 1"
    assert "no NUMA node reported" in none.source and none.source.endswith("is -1)")
    missing = locate("cuda:3", "0000:01:00.0")
    assert missing.node is None and "not readable" in missing.source
    assert locate("cuda:4", None).source == "no PCI address known for it"
    assert on_1.to_dict()["numa_node"] == 1


def test_a_known_node_is_preferred_or_bound(two_nodes: Path) -> None:
    gpu = locate("cuda:1", "0000:d8:00.0")
    assert near_placement("t", gpu, "prefer") == locality.NearPlacement(
        "preferred", (1,), "gpu: cuda:1 (PCI 0000:d8:00.0) on NUMA node 1"
    )
    assert near_placement("t", gpu, "require").policy == "bind"


def test_no_node_does_nothing_and_says_so_once(
    two_nodes: Path, caplog: pytest.LogCaptureFixture
) -> None:
    gpu = locate("cuda:2", "0000:5e:00.0")
    caplog.set_level(logging.WARNING, LOGGER)
    first = near_placement("tier:kv", gpu, "prefer")
    again = near_placement("tier:mamba", gpu, "prefer")
    assert first.policy == again.policy == "none" and first.nodes == ()
    assert "no NUMA node reported" in first.note and first.note.endswith("tier left unbound")
    said = _said(caplog)
    assert len(said) == 1 and "said once per process" in said[0]


def test_require_without_a_node_fails_only_where_nodes_differ(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    gpu = DeviceLocality("cuda:0", "0000:5e:00.0", None, "no NUMA node reported")
    with _os.use_roots(sys=fake_gpus(tmp_path / "two", (0, 1), {})):
        with pytest.raises(PlacementError, match=r"numa_mode 'require'.*nodes 0-1.*numa_nodes"):
            near_placement("tier:kv", gpu, "require")
        with pytest.raises(PlacementError, match="a host pool, no GPU to be near"):
            near_placement("tier:kv", None, "require")
    with _os.use_roots(sys=fake_gpus(tmp_path / "one", (0,), {})):
        assert near_placement("tier:kv", gpu, "require").policy == "none"  # all nodes near


def test_schema_takes_gpu_without_nodes() -> None:
    section = PlacementSection(numa_policy="gpu", numa_mode="require")
    assert section.numa_nodes == ()
    with pytest.raises(ValueError, match="'gpu' takes each tier's node from its pool's GPU"):
        PlacementSection(numa_policy="gpu", numa_nodes=(0,))
    with pytest.raises(ConfigError, match="numa_policy"):
        load_config(overrides={"placement.numa_policy": "gpus"})


# --- real regions on the faked topology -------------------------------------------------------


def _placement(mode: str = "prefer", **changes: Any) -> AnonymousPlacement:
    section = PlacementSection(numa_policy="gpu", numa_mode=mode, prefault=True, **changes)
    return AnonymousPlacement(section, NoOptions())


@needs_numa
@pytest.mark.parametrize(("mode", "policy"), [("prefer", "preferred"), ("require", "bind")])
def test_a_tier_lands_on_its_gpu_node(tmp_path: Path, mode: str, policy: str) -> None:
    """Faked: the GPU sits on the node this process's memory really lands on."""
    home = home_node()
    with _os.use_roots(sys=fake_gpus(tmp_path, real_nodes(), {"0000:3b:00.0": str(home)})):
        gpu = locate("cuda:0", "0000:3b:00.0")
        with _placement(mode).open_region("tier:kv", 2 * MIB, device=gpu) as region:
            audit = region.audit()
    assert (audit.numa_policy_obtained, audit.numa_nodes_obtained) == (policy, (home,))
    assert audit.pages_per_node == {home: audit.numa_sampled_pages}  # pre-faulted, all there
    assert audit.numa_near == f"gpu: cuda:0 (PCI 0000:3b:00.0) on NUMA node {home}"
    assert audit.fallbacks == ()


@needs_numa
def test_a_gpu_on_a_node_the_kernel_lacks_falls_back_or_fails(tmp_path: Path) -> None:
    """Faked: /sys puts the GPU on a node this one-node kernel does not have, so mbind really
    refuses it: ``prefer`` records the fallback and goes on, ``require`` fails."""
    extra = absent_node()
    sys_root = fake_gpus(tmp_path, (*real_nodes(), extra), {"0000:d8:00.0": str(extra)})
    with _os.use_roots(sys=sys_root):
        gpu = locate("cuda:1", "0000:d8:00.0")
        with _placement("prefer").open_region("tier:kv", MIB, device=gpu) as region:
            audit = region.audit()
        with pytest.raises(PlacementError, match="mode require"):
            _placement("require").open_region("tier:kv", MIB, device=gpu)
    assert [what for what, _ in audit.fallbacks] == ["numa"]
    assert audit.numa_nodes_requested == (extra,) and f"node {extra}" in audit.numa_near


def test_other_policies_ignore_the_device(two_nodes: Path) -> None:
    node = real_nodes()[0]
    section = PlacementSection(numa_policy="bind", numa_nodes=(node,))
    gpu = locate("cuda:1", "0000:d8:00.0")
    with AnonymousPlacement(section, NoOptions()).open_region("t", MIB, device=gpu) as region:
        audit = region.audit()
    assert audit.numa_nodes_requested == (node,) and audit.numa_near == ""


# --- through the dram backend -----------------------------------------------------------------


class LocatingTransport(MemoryTransport):
    """A memory transport that says its pools live on a GPU (faked: this host has none)."""

    def __init__(self, device: DeviceLocality) -> None:
        super().__init__()
        self.device = device

    def locate(self, endpoint: Endpoint) -> DeviceLocality | None:
        return self.device


GEOMETRY = PoolGeometry("kv", "page_first", 2, 1, 64, "uint8", 4, 64)


@needs_numa
def test_the_backend_places_each_tier_near_its_pool_device(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    home = home_node()
    sys_root = fake_gpus(tmp_path, real_nodes(), {"0000:3b:00.0": str(home), **GPUS})
    overrides = {"placement.numa_policy": "gpu", "placement.capacity_bytes": GEOMETRY.nbytes}
    with _os.use_roots(sys=sys_root):
        for address, expected in (("0000:3b:00.0", f"node {home}"), ("0000:5e:00.0", "-1")):
            transport = LocatingTransport(locate("cuda:0", address))
            with build_pipeline(load_config(overrides=overrides), transport=transport) as pipeline:
                pipeline.register_pool("kv", GEOMETRY, np.zeros(GEOMETRY.shape, np.uint8))
                audit = pipeline.audit()["kv"]
                stats = pipeline.stats()
            assert expected in audit["numa_near"]
            assert stats.pools["kv"]["device"]["pci_address"] == address
    assert len(_said(caplog)) == 1  # the node-less GPU, said once


def test_a_placement_written_for_two_arguments_still_works() -> None:
    calls: list[tuple[Any, ...]] = []
    builtin = AnonymousPlacement(PlacementSection(), NoOptions())

    class TwoArguments:
        def open_region(self, name: str, size: int) -> Any:
            calls.append((name, size))
            return builtin.open_region(name, size)

        def new_store(self, capacity: int) -> Any:
            return Store(capacity)

    loaded = load_config(overrides={"placement.capacity_bytes": GEOMETRY.nbytes})
    transport = LocatingTransport(DeviceLocality("cuda:0", None, 0, "faked"))
    context = BackendContext(loaded, TwoArguments(), transport, None)  # type: ignore[arg-type]
    backend = DramBackend(context, None)
    buffer = np.zeros(GEOMETRY.shape, np.uint8)
    endpoint = Endpoint(buffer.ctypes.data, buffer.nbytes, "cpu", buffer)
    pool = backend.attach(PoolSpec("kv", GEOMETRY, endpoint))
    backend.close()
    assert calls == [("tier:kv", GEOMETRY.nbytes)]
    assert pool.stats()["device"]["device"] == "cuda:0"


def test_stats_report_what_each_pool_holds_on_the_host() -> None:
    overrides = {"placement.capacity_bytes": 2 * GEOMETRY.nbytes}
    with build_pipeline(load_config(overrides=overrides)) as pipeline:
        pipeline.register_pool("kv", GEOMETRY, np.zeros(GEOMETRY.shape, np.uint8))
        pipeline.register_pool("swa", GEOMETRY, np.zeros(GEOMETRY.shape, np.uint8))
        stats = pipeline.stats()
    for name in ("kv", "swa"):
        pool = stats.pools[name]
        assert pool["tier_bytes"] == 2 * GEOMETRY.nbytes
        assert (pool["pinned_bytes"], pool["registration_s"], pool["device"]) == (0, 0.0, None)
    assert stats.memory == {"tier_bytes": 4 * GEOMETRY.nbytes, "pinned_bytes": 0,
                            "registration_s": 0.0}  # fmt: skip
