"""Tests for the batch call's wrapper (no GPU needed: the runtime is a recording fake).

The calls themselves are tested on a GPU in test_cuda.py (every staged and batched restore
there is checked byte for byte).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvcr_policy.backends.dram.transports.cuda_batch import BatchCopier, runtime_path
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


class Stream:
    """A torch stream's surface that :meth:`BatchCopier.copy_split` uses."""

    def __init__(self, handle: int, log: list[str]) -> None:
        self.cuda_stream = handle
        self.log = log

    def wait_stream(self, other: Stream) -> None:
        self.log.append(f"{self.cuda_stream} waits {other.cuda_stream}")


def test_a_split_puts_half_on_the_side_stream_between_two_waits() -> None:
    runtime, log = FakeRuntime(), []
    main, side = Stream(1, log), Stream(2, log)
    BatchCopier(runtime, 13000).copy_split(*arrays(9), main, side)
    assert [call[3].value for call in runtime.calls] == [4, 5]
    assert [call[-1].value for call in runtime.calls] == [1, 2]
    assert log == ["2 waits 1", "1 waits 2"]  # the side starts after main, main ends after it
    runtime = FakeRuntime()
    BatchCopier(runtime, 13000).copy_split(*arrays(3), main, side)  # too few to split
    assert [call[-1].value for call in runtime.calls] == [1]


def test_the_runtime_is_found_among_the_mapped_libraries(tmp_path: Path) -> None:
    maps = tmp_path / "maps"
    maps.write_text(
        "7f00-7f01 r-xp 0 08:01 1 /usr/lib/libc.so.6\n"
        "7f02-7f03 r-xp 0 08:01 2 /opt/venv/nvidia/cu13/lib/libcudart.so.13\n"
    )
    assert runtime_path(str(maps)) == "/opt/venv/nvidia/cu13/lib/libcudart.so.13"
    assert runtime_path(str(tmp_path / "absent")) is None
