"""The dram backend holds each pool's tier to the memory the process can get before it maps it.

The limits are faked (``tests.support.cgroups.FakeHost``: this machine's cgroup has no limit);
the pipeline, its backend and the regions they open or refuse are real. The same refusal under
a real memory cgroup is in tests/config/test_preflight_in_a_cgroup.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvcr_policy.backends.dram.transports.memory import MemoryTransport
from kvcr_policy.errors import TierMemoryError
from kvcr_policy.memory.linux import use_roots
from tests.support.cgroups import GIB, MIB, FakeHost
from tests.support.pipelines import Build, build, geometry, keep_switch_interval
from tests.support.pools import random_buffer

__all__ = ["build", "keep_switch_interval"]  # fixtures


class Pinning(MemoryTransport):
    """The memory transport, saying that it pins each tier as the cuda transport does."""

    pins_regions = True


@pytest.fixture
def pod(tmp_path: Path) -> FakeHost:
    """A host of 1 GiB, half free, this process in a v2 cgroup with 96 MiB left of 128 MiB."""
    host = FakeHost(tmp_path, total=GIB, available=512 * MIB)
    host.v2("/pod")
    host.limit_v2("/sys/fs/cgroup/pod", 128 * MIB, current=32 * MIB)
    return host


def _buffer() -> object:
    return random_buffer(geometry("layer_first"), np.random.default_rng(1), "numpy-float16")


def test_a_prefaulted_tier_above_the_cgroup_is_refused_before_it_is_mapped(
    build: Build, pod: FakeHost
) -> None:
    pipeline = build("default", {"placement.capacity_bytes": "100MiB", "placement.prefault": True})
    with use_roots(proc=pod.proc, sys=pod.sys), pytest.raises(TierMemoryError) as caught:
        pipeline.register_pool("kv", geometry("layer_first"), _buffer())
    text = str(caught.value)
    assert "placement.capacity_bytes = 100MiB (from override)" in text
    assert (
        f"cgroup v2 memory.max leaves 96MiB of 128MiB ({pod.sys}/fs/cgroup/pod/memory.max" in text
    )
    assert pipeline.pools == {} and pipeline.backend._pools == []  # nothing mapped


def test_a_pinning_transport_holds_its_tier_to_what_is_free_now(
    build: Build, tmp_path: Path
) -> None:
    """On a host of 1 GiB with 512 MiB free, a 600 MiB tier may grow as pages arrive, but not
    be pinned (which faults all of it in) at once."""
    host = FakeHost(tmp_path, total=GIB, available=512 * MIB)
    growing = build("default", {"placement.capacity_bytes": "600MiB"})
    pinned = build("default", {"placement.capacity_bytes": "600MiB"}, transport=Pinning())
    with use_roots(proc=host.proc, sys=host.sys):
        growing.register_pool("kv", geometry("layer_first"), _buffer())
        with pytest.raises(TierMemoryError, match="takes 600MiB at once"):
            pinned.register_pool("kv", geometry("layer_first"), _buffer())


def test_each_pool_counts_the_growing_tiers_opened_before_it(build: Build, pod: FakeHost) -> None:
    pipeline = build("default", {"placement.capacity_bytes": "40MiB"})
    with use_roots(proc=pod.proc, sys=pod.sys):
        pipeline.register_pool("kv", geometry("layer_first"), _buffer())
        pipeline.register_pool("v", geometry("layer_first"), _buffer())  # 80 of 96 MiB
        with pytest.raises(TierMemoryError) as caught:
            pipeline.register_pool("swa", geometry("layer_first"), _buffer())
    assert "the tier of pool 'swa' grows to 40MiB as pages arrive besides the 80MiB" in str(
        caught.value
    )
    assert set(pipeline.pools) == {"kv", "v"}
