"""A Mooncake writer for the tests to kill mid-put (run as a child process).

``python -m tests.plugins.mooncake.stalled_writer MASTER PAGES [mla]``: a pipeline on
``MASTER`` (contributing no segment) with pool ``kv`` of :data:`~.mooncake_helpers.GEO` (K and V
apart: several buffers a page), or of :data:`MLA` (one buffer a page), its pages filled with
0x77; it prints ``ready``, waits for one line on stdin, then stores keys
``stalled-0..PAGES-1`` (and prints what ``set`` returned, if it ever returns). A test stops the
process holding the segment first, so the put starts at the master and its bytes never arrive,
then kills this process: the master keeps the unfinished objects.
"""

from __future__ import annotations

import sys

from kvcr_policy.geometry import PoolGeometry
from tests.plugins.mooncake.mooncake_helpers import GEO, pipeline_on
from tests.support.pools import pages_of, pool_buffer, token_indices


class _Master:
    def __init__(self, address: str) -> None:
        self.address = address


#: 16 KiB pages that are one run of the pool (MLA page_first): one buffer a page.
MLA = PoolGeometry("kv", "page_first", 4, 1, 2048, "float16", 1, 256, mla=True)


def main(master: str, pages: int, geometry: PoolGeometry) -> None:
    buffer = pool_buffer(geometry)
    pages_of(buffer, geometry)[:] = 0x77
    with pipeline_on(_Master(master)) as pipeline:
        pipeline.register_pool("kv", geometry, buffer)
        print("ready", flush=True)
        sys.stdin.readline()
        keys = [f"stalled-{i}" for i in range(pages)]
        print(pipeline.set(keys, token_indices(range(pages), geometry.page_size)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), MLA if sys.argv[3:] == ["mla"] else GEO)
