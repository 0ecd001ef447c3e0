"""The scheduler's part of SGLang's HiCache around one real ``HiCacheController``.

SGLang 0.5.23's scheduler (``UnifiedRadixCache`` driving a ``HybridCacheController``) needs
published server args and a model runner, so its part is played here, as SGLang plays it:
match the host pool, ask the controller to prefetch the rest from storage, allocate host memory
for a hit (evicting the least recently used host pages, as the radix tree does; one prefetch at
most half the host pool, SGLang's ``prefetch_capacity_limit``), hand the operation to the
controller's I/O thread, load the prefix to the device pool through the controller's load path,
and write new pages through (device -> host -> storage) after the prefill.

**TTFT.** A request's time to first token is the time until its prefix is on the device pool
(measured: host matching, prefetch from the tier, load to the device) plus a prefill stand-in,
``tokens computed x seconds per token`` (:mod:`.prefill` says how the rate is measured). Every
page that reaches the device is compared with the bytes its key names; a request's "output" is a
digest of the KV its prompt ran on, restored or computed: greedy decoding is a function of it.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from typing import Any

import numpy as np

from .sglang_stack import DEVICE_TOKENS, HOST_TOKENS, PAGE, build_stack, device_planes, page_kv

__all__ = ["Replay"]

WAIT_S = 120.0
CHUNK = DEVICE_TOKENS // PAGE  # pages the device pool takes at once


class Replay:
    """See the module docstring; ``extra`` is our backend's extra config, or None; ``rank`` of
    ``ranks`` tensor-parallel ranks (each a process running the same requests: the controller's
    collectives keep them in step)."""

    def __init__(
        self,
        extra: dict[str, Any] | None,
        prefill_s_per_token: float,
        rank: int = 0,
        ranks: int = 1,
        mla: bool = False,
        rendezvous: str | None = None,
    ) -> None:
        stack = build_stack(extra, rank, ranks, mla, rendezvous)
        self.rank, self.mla = rank, mla
        self.torch, self.hash = stack.torch, stack.hash
        self.device, self.allocator, self.host = stack.device, stack.allocator, stack.host
        self.controller = stack.controller
        self.storage = extra is not None
        self.rate = prefill_s_per_token
        self.cached: OrderedDict[str, int] = OrderedDict()  # key -> first host row (LRU)
        self.records: list[dict[str, Any]] = []
        self.mismatched = 0

    def _kv(self, key: str) -> np.ndarray:
        return page_kv(key, self.rank, self.mla)

    # ---- host memory ----------------------------------------------------------------------

    def _rows(self, starts: list[int]) -> Any:
        torch = self.torch
        if not starts:
            return torch.zeros(0, dtype=torch.int64)
        return torch.cat([torch.arange(s, s + PAGE, dtype=torch.int64) for s in starts])

    def _alloc_host(self, tokens: int, locked: set[str]) -> Any:
        while self.host.available_size() < tokens:
            victim = next((k for k in self.cached if k not in locked), None)
            if victim is None:
                return None
            self.controller.evict_host(self._rows([self.cached.pop(victim)]))
        return self.host.alloc(tokens)

    # ---- one request ----------------------------------------------------------------------

    def request(self, number: int, tokens: list[int]) -> dict[str, Any]:
        started = time.perf_counter()
        keys = self.hash(tokens, None, page_size=PAGE)
        limit = len(keys) - 1  # the last page is computed: its last token makes the first one
        hit = 0
        while hit < limit and keys[hit] in self.cached:
            self.cached.move_to_end(keys[hit])
            hit += 1
        locked = set(keys[:hit])
        host_hit = hit
        if self.storage and hit < limit:
            rid = f"r{number}-{len(self.records)}"
            hit += self._prefetch(rid, tokens, keys, hit, locked, limit)
        digest = hashlib.blake2b(digest_size=16)
        self._to_device(keys[:hit], digest)
        computed = (len(keys) - hit) * PAGE
        ttft = time.perf_counter() - started + computed * self.rate
        if self.storage and computed:  # the engine's prefill rate, for the admission gate
            self.controller.storage_backend.pipeline.prefill_observed(
                computed, computed * self.rate
            )
        for key in keys[hit:]:
            digest.update(self._kv(key).tobytes())
        self._write_through(tokens, keys, hit, locked)
        return {
            "prompt_tokens": len(keys) * PAGE,
            "cached_tokens": hit * PAGE,
            "host_hit_tokens": host_hit * PAGE,
            "l3_hit_tokens": (hit - host_hit) * PAGE,
            "ttft_s": ttft,
            "output": [digest.hexdigest()],
        }

    def _prefetch(
        self,
        rid: str,
        tokens: list[int],
        keys: list[str],
        start: int,
        locked: set[str],
        limit: int,
    ) -> int:
        """Storage -> host through the controller's prefetch threads; pages that arrived."""
        ctl = self.controller
        ctl.prefetch(rid, tokens[start * PAGE :], keys[start - 1] if start else None)
        op = ctl.prefetch_hit_queue.get(timeout=WAIT_S)
        pages = min(op.storage_hit_count // PAGE, HOST_TOKENS // PAGE // 2, limit - start)
        if pages == 0:
            return 0
        host_indices = self._alloc_host(pages * PAGE, locked)
        if host_indices is None:
            return 0
        op.hash_value = op.hash_value[:pages]
        op.host_indices = host_indices
        ctl.prefetch_tokens_occupied += pages * PAGE
        ctl.prefetch_buffer.put(op)
        completed = 0
        while True:
            ack = ctl.ack_prefetch_queue.get(timeout=WAIT_S)
            if ack.completed_tokens is not None:
                completed = max(completed, ack.completed_tokens)
            if ack.completed_req:
                break
        ctl.prefetch_tokens_occupied -= pages * PAGE
        arrived = completed // PAGE
        starts = [int(s) for s in host_indices[::PAGE].tolist()]
        if arrived < pages:
            ctl.evict_host(self._rows(starts[arrived:]))
        for key, row in zip(keys[start : start + arrived], starts[:arrived], strict=True):
            self.cached[key] = row
            locked.add(key)
        return arrived

    def _to_device(self, keys: list[str], digest: Any) -> None:
        """Host -> device through the controller's load path, a device pool at a time; every
        page compared with its key's bytes and added to the request's digest."""
        torch, ctl = self.torch, self.controller
        for first in range(0, len(keys), CHUNK):
            chosen = keys[first : first + CHUNK]
            device_indices = ctl.load(self._rows([self.cached[k] for k in chosen]))
            assert device_indices is not None, "device pool exhausted"
            ctl.start_loading()
            for ack in ctl.ack_load_queue:
                ack.finish_event.synchronize()
            ctl.ack_load_queue.clear()
            for i, key in enumerate(chosen):
                rows = device_indices[i * PAGE : (i + 1) * PAGE]
                planes = device_planes(self.device)
                got = np.stack(
                    [np.stack([t[rows].view(torch.int16).numpy() for t in p]) for p in planes]
                )
                if not np.array_equal(got, self._kv(key)):
                    self.mismatched += 1
                digest.update(got.tobytes())
            self.allocator.free(device_indices)

    def _write_through(
        self, tokens: list[int], keys: list[str], start: int, locked: set[str]
    ) -> None:
        """New pages: computed on the device, written to the host, backed up to storage."""
        torch, ctl = self.torch, self.controller
        for first in range(start, len(keys), CHUNK):
            chosen = keys[first : first + CHUNK]
            device_indices = self.allocator.alloc(len(chosen) * PAGE)
            assert device_indices is not None, "device pool exhausted"
            for i, key in enumerate(chosen):
                rows = device_indices[i * PAGE : (i + 1) * PAGE]
                kv = torch.from_numpy(self._kv(key))
                for side, plane in enumerate(device_planes(self.device)):
                    for layer, tensor in enumerate(plane):
                        tensor.view(torch.int16)[rows] = kv[side, layer]
            room = self._alloc_host(len(chosen) * PAGE, locked)
            if room is None:
                self.allocator.free(device_indices)
                return
            self.host.free(room)
            host_indices = ctl.write(device_indices, node_id=first)
            assert host_indices is not None
            for ack in ctl.ack_write_queue:
                ack.finish_event.synchronize()
            ctl.ack_write_queue.clear()
            self.allocator.free(device_indices)
            if self.storage:
                piece = tokens[first * PAGE : (first + len(chosen)) * PAGE]
                op_id = ctl.write_storage(host_indices, piece, hash_value=chosen)
                acked = ctl.ack_backup_queue.get(timeout=WAIT_S)
                assert acked.id == op_id
            for key, row in zip(chosen, host_indices[::PAGE].tolist(), strict=True):
                self.cached[key] = int(row)

    # ---- the run ---------------------------------------------------------------------------

    def flush_host(self) -> None:
        """Evict every host page (the host cache went to other traffic): only storage has them."""
        starts = list(self.cached.values())
        self.cached.clear()
        self.controller.evict_host(self._rows(starts))

    def run(self, prompts: list[list[int]], passes: int) -> dict[str, Any]:
        counters: list[dict[str, int]] = []
        for number in range(passes):
            if number:
                self.flush_host()
            for index, tokens in enumerate(prompts):
                record = self.request(index, tokens[: len(tokens) // PAGE * PAGE])
                self.records.append({"pass": number, "request": index, **record})
            counters.append(self._counters())
        return {"records": self.records, "counters": counters, "mismatched_pages": self.mismatched}

    def _counters(self) -> dict[str, int]:
        if not self.storage:
            return {}
        backend = self.controller.storage_backend
        stats = backend.get_stats().kvcr_policy
        counters = {
            name: int(stats.get(name) or 0)
            for name in ("pages_read", "pages_written", "bytes_read", "bytes_written")
        }
        for (decision, _), pages in backend.pipeline.admission.counts.items():
            counters[f"{decision}_pages"] = counters.get(f"{decision}_pages", 0) + pages
        counters["declined_writes_skipped"] = backend.declined.skipped
        return counters

    def close(self) -> None:
        if self.storage:
            self.controller.detach_storage_backend()
