"""Fixtures of the Mooncake tests: a real ``mooncake_master`` on free loopback ports.

Every master, segment holder and client process these tests start is stopped by PID when its
test (or module) ends; masters and holders also die with the test process
(``PR_SET_PDEATHSIG``), so a crashed run leaves nothing behind.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.plugins.mooncake.mooncake_helpers import need_mooncake


@pytest.fixture(scope="module")
def master() -> Iterator[Any]:
    """One master for the module's tests."""
    need_mooncake()
    from kvcr_policy_mooncake.master import MasterProcess

    with MasterProcess() as process:
        yield process


@pytest.fixture(scope="module")
def segment(master: Any) -> Iterator[Any]:
    """A segment process of 64 MiB on the module's master: where the pipelines' pages live
    (they contribute no segment of their own)."""
    from kvcr_policy_mooncake.segment import SegmentProcess

    holder = SegmentProcess(master.address, 64 << 20)
    try:
        yield holder
    finally:
        holder.stop()
