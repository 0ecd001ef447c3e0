"""Tests for the batch call's wrapper (no GPU needed: the runtime is a recording fake).

The calls themselves are tested on a GPU in test_cuda.py (every staged and batched restore
there is checked byte for byte).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvcr_policy.backends.dram.transports.cuda_batch import (
    CALL_PIECES,
    BatchCopier,
    runtime_path,
)
from kvcr_policy.errors import TransportError


class FakeRuntime:
    """``cudaMemcpyBatchAsync`` and ``cudaGetErrorString`` that record what they were given."""

    def __init__(self, status: int = 0) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.status = status
        self.cudaGetErrorString = self.error
        self.cudaMemcpyBatchAsync = self.batch

    def batch(self, *args: Any) -> int:
        self.calls.append(args)
        return self.status

    def error(self, status: int) -> bytes:
        return b"invalid argument"


def arrays(count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    dsts = np.arange(count, dtype=np.uint64) * 4096 + (1 << 20)
    srcs = np.arange(count, dtype=np.uint64) * 8192
    return dsts, srcs, np.full(count, 4096, dtype=np.uint64)


@pytest.mark.parametrize(("version", "arguments"), [(13000, 8), (12080, 9)])
def test_the_call_matches_the_runtime_signature(version: int, arguments: int) -> None:
    """12.8 and 12.9 take the failing index's address before the stream; 13 dropped it."""
    runtime = FakeRuntime()
    copier = BatchCopier(runtime, version)
    dsts, srcs, sizes = arrays(5)
    copier.copy(dsts, srcs, sizes, stream=0xABC)
    (call,) = runtime.calls
    assert len(call) == arguments
    assert call[0].value == dsts.ctypes.data and call[1].value == srcs.ctypes.data
    assert call[2].value == sizes.ctypes.data and call[3].value == 5
    assert call[-1].value == 0xABC  # the stream, last
    attributes = call[4]._obj
    assert attributes.srcAccessOrder == 1  # sources read in stream order


def test_an_empty_batch_calls_nothing_and_a_failure_names_the_error() -> None:
    runtime = FakeRuntime()
    BatchCopier(runtime, 13000).copy(*arrays(0), stream=0)
    assert runtime.calls == []
    failing = BatchCopier(FakeRuntime(status=1), 13000)
    with pytest.raises(TransportError, match="cudaMemcpyBatchAsync of 3 pieces failed: invalid"):
        failing.copy(*arrays(3), stream=0)


def test_many_pieces_go_in_calls_of_at_most_call_pieces_in_order() -> None:
    runtime = FakeRuntime()
    dsts, srcs, sizes = arrays(2 * CALL_PIECES + 3)
    BatchCopier(runtime, 13000).copy_calls(dsts, srcs, sizes, stream=7)
    assert [call[3].value for call in runtime.calls] == [CALL_PIECES, CALL_PIECES, 3]
    assert {call[-1].value for call in runtime.calls} == {7}  # one stream: in order
    # Each call starts where the one before ended (slices of the caller's arrays).
    starts = [call[0].value for call in runtime.calls]
    assert starts == [dsts.ctypes.data + 8 * i * CALL_PIECES for i in range(3)]
    assert [call[1].value for call in runtime.calls] == [
        srcs.ctypes.data + 8 * i * CALL_PIECES for i in range(3)
    ]
    runtime = FakeRuntime()
    BatchCopier(runtime, 13000).copy_calls(*arrays(CALL_PIECES), stream=7)  # a fill: one call
    assert [call[3].value for call in runtime.calls] == [CALL_PIECES]


def test_the_runtime_is_found_among_the_mapped_libraries(tmp_path: Path) -> None:
    maps = tmp_path / "maps"
    maps.write_text(
        "7f00-7f01 r-xp 0 08:01 1 /usr/lib/libc.so.6\n"
        "7f02-7f03 r-xp 0 08:01 2 /opt/venv/nvidia/cu13/lib/libcudart.so.13\n"
    )
    assert runtime_path(str(maps)) == "/opt/venv/nvidia/cu13/lib/libcudart.so.13"
    assert runtime_path(str(tmp_path / "absent")) is None
