"""SGLang's real ``HiCacheController`` drives our backend over the Mooncake conversation trace, on
the CPU, in one process (run as a child: it initialises torch.distributed and SGLang's global
parallel state)::

    python -m tests.integrations.sglang.controller_replay --requests 200 [--passes 2]
        [--overrides JSON] [--profile NAME] [--trace data/traces/conversation_trace.jsonl.xz]

prints one JSON object of figures per pass; the host pool is flushed between passes (a host
tier restarted, storage kept), so the second pass reads back through prefetch.

What is SGLang's own is listed in ``replay_stack``. What is not SGLang's, and why:

- the device-host copy kernel ``sgl_kernel.kvcacheio.transfer_kv_direct``: SGLang imports it
  only on CUDA, ROCm and XPU builds, so ``pool_host.mha`` has no such name on a CPU. A torch
  index copy with the same arguments stands in (:func:`transfer_kv_direct`).
- the scheduler around the controller: SGLang 0.5.23 has no ``HiRadixCache``; its successor
  ``UnifiedRadixCache`` drives a ``HybridCacheController`` and needs published server args and
  a model runner. The scheduler's part is played here (:class:`Replay`): match the host, ask the
  controller to prefetch the rest, allocate host memory for a hit (evicting the least recently
  used host blocks, as the radix tree does; one prefetch at most half the host pool, SGLang's
  ``prefetch_capacity_limit``), hand the operation to the I/O thread, and write new pages
  through (device -> host -> storage).

Trace to tokens: every 512-token block id of a request becomes 512 token ids derived from the
id, so equal ids give equal tokens and SGLang's own hashing gives equal page keys. Every page's
K and V bytes are derived from its key, so any page read back is checked byte for byte.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np

from tests.integrations.sglang.replay_stack import (
    BLOCK,
    DEVICE_TOKENS,
    HOST_BLOCKS,
    LAYERS,
    PAGE,
    TRACE,
    block_tokens,
    build_stack,
    page_kv,
    read_requests,
)

WAIT_S = 120.0


class Replay:
    """The scheduler's side of HiCache around one real controller (see the module docstring)."""

    def __init__(self, overrides: dict[str, Any], profile: str | None) -> None:
        stack = build_stack(overrides, profile)
        self.torch, self.hash = stack.torch, stack.hash
        self.device, self.allocator, self.host = stack.device, stack.allocator, stack.host
        self.controller = stack.controller
        self.backend = self.controller.storage_backend
        # host page cache: key -> first host token index of its page (LRU order)
        self.cached: OrderedDict[str, int] = OrderedDict()
        self.figures: dict[str, Any] = {
            "requests": 0, "pages": 0, "host_hit_pages": 0, "storage_hit_pages": 0,
            "prefetched_pages": 0, "written_pages": 0, "evicted_pages": 0,
            "loaded_to_device_pages": 0, "checked_pages": 0, "mismatched_pages": 0,
            "dropped_pages": 0,
        }  # fmt: skip
        self.prefetch_ms: list[float] = []

    # ---- host memory ----------------------------------------------------------------------

    def _alloc_host(self, tokens: int, locked: set[str]) -> Any:
        while self.host.available_size() < tokens:
            victim = next((k for k in self.cached if k not in locked), None)
            if victim is None:
                return None
            start = self.cached.pop(victim)
            self.controller.evict_host(self._rows([start]))
            self.figures["evicted_pages"] += 1
        return self.host.alloc(tokens)

    def _rows(self, starts: list[int]) -> Any:
        torch = self.torch
        if not starts:
            return torch.zeros(0, dtype=torch.int64)
        return torch.cat([torch.arange(s, s + PAGE, dtype=torch.int64) for s in starts])

    def _check_host(self, keys: list[str], starts: list[int]) -> None:
        torch = self.torch
        for key, start in zip(keys, starts, strict=True):
            got = self.host.get_data_page(start, flat=True).view(torch.int16).numpy()
            self.figures["checked_pages"] += 1
            if not np.array_equal(got, page_kv(key).reshape(-1)):
                self.figures["mismatched_pages"] += 1

    # ---- one request ----------------------------------------------------------------------

    def request(self, rid: str, tokens: list[int]) -> None:
        keys = self.hash(tokens, None, page_size=PAGE)
        self.figures["requests"] += 1
        self.figures["pages"] += len(keys)
        host_hit = 0
        while host_hit < len(keys) and keys[host_hit] in self.cached:
            self.cached.move_to_end(keys[host_hit])
            host_hit += 1
        self.figures["host_hit_pages"] += host_hit
        locked = set(keys[:host_hit])
        done = host_hit + self._prefetch(rid, tokens, keys, host_hit, locked)
        self._write_through(tokens, keys, done, locked)

    def _prefetch(
        self, rid: str, tokens: list[int], keys: list[str], start: int, locked: set[str]
    ) -> int:
        """Storage -> host through the controller's prefetch threads; pages that arrived."""
        ctl = self.controller
        last = keys[start - 1] if start else None
        op = ctl.prefetch(rid, tokens[start * PAGE :], last)
        op = ctl.prefetch_hit_queue.get(timeout=WAIT_S)
        assert op.request_id == rid
        hit_pages = min(op.storage_hit_count // PAGE, HOST_BLOCKS * BLOCK // PAGE // 2)
        self.figures["storage_hit_pages"] += op.storage_hit_count // PAGE
        if hit_pages == 0:
            return 0
        host_indices = self._alloc_host(hit_pages * PAGE, locked)
        if host_indices is None:
            return 0
        op.hash_value = op.hash_value[:hit_pages]
        op.host_indices = host_indices
        ctl.prefetch_tokens_occupied += hit_pages * PAGE
        ctl.prefetch_buffer.put(op)
        completed = 0
        while True:
            ack = ctl.ack_prefetch_queue.get(timeout=WAIT_S)
            if ack.completed_tokens is not None:
                completed = max(completed, ack.completed_tokens)
            if ack.completed_req:
                break
        self.prefetch_ms.append((time.monotonic() - op.start_time) * 1e3)
        ctl.prefetch_tokens_occupied -= hit_pages * PAGE
        arrived = completed // PAGE
        starts = [int(s) for s in host_indices[::PAGE].tolist()]
        if arrived < hit_pages:
            ctl.evict_host(self._rows(starts[arrived:]))
        new_keys = keys[start : start + arrived]
        self._check_host(new_keys, starts[:arrived])
        for key, row in zip(new_keys, starts[:arrived], strict=True):
            self.cached[key] = row
            locked.add(key)
        self.figures["prefetched_pages"] += arrived
        self._load_back(new_keys[: DEVICE_TOKENS // PAGE], starts[: DEVICE_TOKENS // PAGE])
        return arrived

    def _load_back(self, keys: list[str], starts: list[int]) -> None:
        """Host -> device through the controller's load path; the device rows checked."""
        if not keys:
            return
        torch, ctl = self.torch, self.controller
        device_indices = ctl.load(self._rows(starts))
        assert device_indices is not None
        ctl.start_loading()
        for ack in ctl.ack_load_queue:
            ack.finish_event.synchronize()
        ctl.ack_load_queue.clear()
        for i, key in enumerate(keys):
            rows = device_indices[i * PAGE : (i + 1) * PAGE]
            expected = page_kv(key)
            for layer in range(LAYERS):
                for side, buffers in enumerate((self.device.k_buffer, self.device.v_buffer)):
                    got = buffers[layer][rows].view(torch.int16).numpy()
                    if not np.array_equal(got, expected[side, layer]):
                        self.figures["mismatched_pages"] += 1
            self.figures["loaded_to_device_pages"] += 1
        self.allocator.free(device_indices)

    def _write_through(
        self, tokens: list[int], keys: list[str], start: int, locked: set[str]
    ) -> None:
        """New pages: computed on the device, written to host, backed up to storage."""
        torch, ctl = self.torch, self.controller
        chunk = DEVICE_TOKENS // PAGE
        for first in range(start, len(keys), chunk):
            chosen = keys[first : first + chunk]
            device_indices = self.allocator.alloc(len(chosen) * PAGE)
            assert device_indices is not None, "device pool exhausted"
            for i, key in enumerate(chosen):
                rows = device_indices[i * PAGE : (i + 1) * PAGE]
                kv = torch.from_numpy(page_kv(key))
                for layer in range(LAYERS):
                    self.device.k_buffer[layer].view(torch.int16)[rows] = kv[0, layer]
                    self.device.v_buffer[layer].view(torch.int16)[rows] = kv[1, layer]
            if self._alloc_room(len(chosen) * PAGE, locked) is None:
                self.allocator.free(device_indices)
                self.figures["dropped_pages"] += len(keys) - first
                return
            host_indices = ctl.write(device_indices, node_id=first)
            assert host_indices is not None
            for ack in ctl.ack_write_queue:
                ack.finish_event.synchronize()
            ctl.ack_write_queue.clear()
            self.allocator.free(device_indices)
            piece = tokens[first * PAGE : (first + len(chosen)) * PAGE]
            op_id = ctl.write_storage(host_indices, piece, hash_value=chosen)
            acked = ctl.ack_backup_queue.get(timeout=WAIT_S)
            assert acked.id == op_id
            self.figures["written_pages"] += acked.completed_tokens // PAGE
            # Backed up (and held by the device cache in SGLang): evictable from now on.
            starts = [int(s) for s in host_indices[::PAGE].tolist()]
            for key, row in zip(chosen, starts, strict=True):
                self.cached[key] = row

    def _alloc_room(self, tokens: int, locked: set[str]) -> Any:
        """Evict until ``tokens`` fit, without allocating (the controller's write allocates)."""
        indices = self._alloc_host(tokens, locked)
        if indices is not None:
            self.host.free(indices)
        return indices

    # ---- the run ---------------------------------------------------------------------------

    def flush_host(self) -> None:
        """Evict every host page (a host tier restarted): only storage still has them."""
        starts = list(self.cached.values())
        self.cached.clear()
        self.controller.evict_host(self._rows(starts))
        self.figures["evicted_pages"] += len(starts)

    def run_pass(self, requests: list[dict[str, Any]]) -> dict[str, Any]:
        for name in self.figures:
            self.figures[name] = 0
        self.prefetch_ms = []
        started = time.perf_counter()
        for number, request in enumerate(requests):
            tokens = [t for block in request["hash_ids"] for t in block_tokens(block)]
            tokens = tokens[: request["input_length"] // PAGE * PAGE]
            self.request(f"r{number}", tokens)
        times = sorted(self.prefetch_ms)
        page_bytes = self.backend.pools["kv"].page_bytes
        return dict(
            self.figures,
            wall_s=round(time.perf_counter() - started, 2),
            prefetched_bytes=self.figures["prefetched_pages"] * page_bytes,
            written_bytes=self.figures["written_pages"] * page_bytes,
            prefetches_with_hits=len(times),
            prefetch_ms_median=round(statistics.median(times), 2) if times else None,
            prefetch_ms_p90=round(times[int(0.9 * (len(times) - 1))], 2) if times else None,
            prefetch_ms_max=round(times[-1], 2) if times else None,
        )

    def run(self, requests: list[dict[str, Any]], passes: int) -> dict[str, Any]:
        """``passes`` over ``requests``; the host is flushed between passes."""
        results = []
        for number in range(passes):
            if number:
                self.flush_host()
            results.append(self.run_pass(requests))
        counters = self.backend.get_stats().kvcr_policy
        return {
            "backend": self.backend.pipeline.backend.name,
            "page_bytes": self.backend.pools["kv"].page_bytes,
            "passes": results,
            "backend_counters": {
                name: counters.get(name)
                for name in ("pages_read", "pages_written", "bytes_read", "bytes_written")
            },
        }

    def close(self) -> None:
        self.controller.detach_storage_backend()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--overrides", default='{"placement.capacity_bytes": "256MiB"}')
    parser.add_argument("--profile", default=None)
    parser.add_argument("--passes", type=int, default=2, help="the host is flushed between")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    requests = read_requests(args.trace, args.requests)
    replay = Replay(json.loads(args.overrides), args.profile)
    try:
        figures = replay.run(requests, args.passes)
    finally:
        replay.close()
    print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
