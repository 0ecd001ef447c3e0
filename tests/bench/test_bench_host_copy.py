"""The host's memory-copy limit (kvcr_policy.bench.host_copy): a real copy of every byte.

Its speed is never asserted (it is the machine's); that it copies exactly the bytes asked, in
shares that cover them once, and refuses what it cannot do, is.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcr_policy.bench import BenchError
from kvcr_policy.bench.host_copy import MIN_SHARE_BYTES, HostCopy, cpus


@settings(max_examples=25, deadline=None)
@given(
    nbytes=st.integers(min_value=1, max_value=6 * MIN_SHARE_BYTES + 12345),
    threads=st.integers(min_value=1, max_value=8),
)
def test_the_shares_cover_every_byte_once(nbytes: int, threads: int) -> None:
    with HostCopy(nbytes, threads) as copy:
        assert 1 <= copy.threads <= max(1, min(threads, nbytes // MIN_SHARE_BYTES))
        shares = [(int(d.src[0]), int(d.length[0])) for d in copy._shares]
        starts = [start for start, _ in shares]
        assert starts[0] == 0 and sum(length for _, length in shares) == nbytes
        ends = [start + length for start, length in shares]
        assert starts[1:] == ends[:-1]  # no gap, no overlap
        assert all(start % 64 == 0 for start in starts)  # no cache line written by two


def test_it_copies_the_source_and_a_changed_byte_is_copied_again() -> None:
    with HostCopy(3 * MIN_SHARE_BYTES + 7, threads=3) as copy:
        assert copy.threads == 3
        assert copy.matches()  # the untimed first copy already moved every byte
        assert copy._src is not None and copy._dst is not None
        copy._src[::4097] = np.arange(len(copy._src[::4097]), dtype=np.uint64).astype(np.uint8)
        copy._src[-1] = 0x11
        assert not copy.matches()
        assert copy.gbps() > 0
        assert copy.matches() and copy._dst[-1] == 0x11


def test_one_thread_per_cpu_this_process_may_use_unless_the_bytes_are_few() -> None:
    with HostCopy(64 * MIN_SHARE_BYTES) as many:
        assert many.threads == min(cpus(), 64)
    with HostCopy(MIN_SHARE_BYTES // 2) as few:
        assert few.threads == 1


def test_bad_sizes_and_use_after_close_are_refused() -> None:
    with pytest.raises(BenchError, match="expected a positive number of bytes, got 0"):
        HostCopy(0)
    copy = HostCopy(4096)
    copy.close()
    with pytest.raises(BenchError, match="used after close"):
        copy.gbps()
    assert copy.matches() is False
