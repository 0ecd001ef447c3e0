"""The memory check every pointer of the generic paths passes before a byte moves."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given

from kvcr_policy.errors import PoolError
from kvcr_policy.integrations.sglang.memory import MemoryMap
from tests.strategies import memory_pieces


@given(memory_pieces())
def test_a_piece_passes_only_inside_one_owned_range(
    drawn: tuple[list[tuple[int, int]], list[tuple[int, int]]],
) -> None:
    ranges, pieces = drawn
    owned = set()
    for start, end in ranges:
        owned.update(range(start, end))

    def inside(address: int, size: int) -> bool:  # the plain reference: byte by byte
        return all(b in owned for b in range(address, address + size))

    memory = MemoryMap.merged(ranges)
    for address, size in pieces:
        pointers = np.array([address], dtype=np.int64)
        sizes = np.array([size], dtype=np.int64)
        if inside(address, size):
            memory.check("pool", pointers, sizes)
        else:
            with pytest.raises(PoolError, match="lies outside every CPU tensor"):
                memory.check("pool", pointers, sizes)


def test_a_pool_owns_the_whole_storage_of_its_cpu_tensors() -> None:
    base = torch.zeros(64, dtype=torch.uint8)

    class Pool:
        def __init__(self) -> None:
            self.kv_buffer = base[16:32]  # a view: its whole storage counts
            self.layers = [torch.zeros(8, dtype=torch.int32)]
            self.scales = {"k": torch.zeros(4, dtype=torch.float32)}
            self.name = "not a tensor"

    memory = MemoryMap.of(Pool())
    assert memory.nbytes == 64 + 32 + 16
    start = base.data_ptr()
    memory.check("pool", np.array([start, start + 60]), np.array([4, 4]))
    with pytest.raises(PoolError, match=r"piece 1 at 0x[0-9a-f]+ \(\+8 bytes\)"):
        memory.check("pool", np.array([start, start + 60]), np.array([4, 8]))
    with pytest.raises(PoolError, match="0 ranges"):
        MemoryMap.merged([]).check("nothing", np.array([start]), np.array([1]))


@pytest.mark.parametrize(
    ("address", "size"),
    [
        ((1 << 63) - 16, 32),  # past the last range, wrapping to a negative end
        (4096, (1 << 63) - 1),  # inside, with a size whose end wraps
        (8000, (1 << 63) - 7000),
        (-(1 << 63), 16),  # what 2**63 becomes as int64
    ],
)
def test_a_piece_whose_end_would_wrap_in_int64_is_refused(address: int, size: int) -> None:
    memory = MemoryMap.merged([(4096, 8192)])
    pointers = np.array([address], dtype=np.int64)
    with pytest.raises(PoolError, match="lies outside every CPU tensor"):
        memory.check("pool", pointers, np.array([size], dtype=np.int64))
