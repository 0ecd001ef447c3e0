"""The replay with real bytes: a trace's first requests stored and restored through a pipeline.

Each block is one page of a small geometry (:data:`GEOMETRY`, 512 bytes a page) whose bytes
follow from the block's id, so every restored page can be checked. For each request, as an
engine does it: ``exists`` counts the leading blocks present (the hits), ``get`` restores them
and each restored page is compared with the bytes its block must hold, then ``set`` stores the
rest. The tier holds ``min(capacity, distinct blocks of these requests)`` pages: a tier that
holds every block never evicts, whatever its size, so the smaller one behaves the same.

The hits must equal the replay model's (:func:`~.replay.replay`) exactly: that checks the
configured backend's eviction against the model, page by page.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from pydantic import ByteSize

from ..config.loading import LoadedConfig
from ..config.schema import EvictionSection
from ..errors import ArgumentError, CapacityError
from ..geometry import PoolGeometry
from ..pipeline import build_pipeline
from .replay import Replay, replay
from .trace import Trace

__all__ = ["GEOMETRY", "MAX_BYTES", "BytesReplay", "replay_bytes"]

#: One page per block: layer_first, 2 layers, 1 head of 16, float16, 4 tokens a page.
GEOMETRY = PoolGeometry("kv", "layer_first", 2, 1, 16, "float16", 4, 4)
_MISMATCHES_KEPT = 5
#: Most bytes a replay with real bytes maps, tier and pool together: 1 GiB.
MAX_BYTES = 1 << 30


@dataclass
class BytesReplay:
    """What the pipeline found, beside what the model predicts for the same requests."""

    requests: int
    tier_pages: int
    hit_blocks: int
    hit_tokens: int
    pages_restored: int
    pages_verified: int
    pages_stored: int
    model: Replay
    seconds: float
    #: The first few pages whose bytes were wrong, or hits that differ, in words.
    problems: list[str] = field(default_factory=list)

    @property
    def agrees(self) -> bool:
        return (
            not self.problems
            and self.hit_blocks == self.model.hit_blocks
            and self.hit_tokens == self.model.hit_tokens
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "tier_pages": self.tier_pages,
            "page_bytes": GEOMETRY.page_bytes,
            "hit_blocks": self.hit_blocks,
            "hit_tokens": self.hit_tokens,
            "model_hit_blocks": self.model.hit_blocks,
            "model_hit_tokens": self.model.hit_tokens,
            "pages_restored": self.pages_restored,
            "pages_verified": self.pages_verified,
            "pages_stored": self.pages_stored,
            "agrees": self.agrees,
            "problems": self.problems,
            "seconds": round(self.seconds, 3),
        }


def _content(block_id: int) -> np.ndarray:
    """The bytes block ``block_id`` holds, as one page of :data:`GEOMETRY` (uint16 elements)."""
    size = GEOMETRY.page_bytes
    seed = hashlib.blake2b(block_id.to_bytes(8, "little"), digest_size=64).digest()
    raw = np.frombuffer(seed * (size // len(seed) + 1), dtype=np.uint8)[:size]
    shape = (2, GEOMETRY.layers, GEOMETRY.page_size, GEOMETRY.heads, GEOMETRY.head_dim)
    return raw.view(np.uint16).reshape(shape)


def _indices(first: int, count: int) -> np.ndarray:
    pages = np.arange(first, first + count, dtype=np.int64).reshape(-1, 1)
    return (pages * GEOMETRY.page_size + np.arange(GEOMETRY.page_size)).reshape(-1)


def replay_bytes(
    loaded: LoadedConfig, trace: Trace, capacity_blocks: int, eviction: EvictionSection
) -> BytesReplay:
    """Store and restore the requests of ``trace`` (take its :meth:`~Trace.head` first) in a
    tier of ``capacity_blocks`` pages evicting with ``eviction``; the model's hits beside."""
    distinct = len(set(trace.ids))
    slots = max(1, min(capacity_blocks, distinct))
    widest = max(trace.starts[i + 1] - trace.starts[i] for i in range(trace.requests))
    pool = replace(GEOMETRY, tokens=max(1, widest) * GEOMETRY.page_size)
    need = (slots + max(1, widest)) * GEOMETRY.page_bytes
    if need > MAX_BYTES:
        message = (
            f"--bytes {trace.requests}: the replay with real bytes would map {need} bytes "
            f"({slots} tier pages and {widest} pool pages of {GEOMETRY.page_bytes} bytes), more "
            f"than {MAX_BYTES}; replay fewer requests or list a smaller capacity"
        )
        raise ArgumentError(message)
    config = loaded.config
    shrunk = config.model_copy(
        update={
            "placement": config.placement.model_copy(
                update={"capacity_bytes": ByteSize(slots * GEOMETRY.page_bytes)}
            ),
            "observability": config.observability.model_copy(update={"metrics": False}),
            "eviction": eviction,
        }
    )
    registry = loaded.registry
    assert registry is not None  # every load_config result carries its registry
    policy = registry.get("eviction", str(eviction.strategy)).create(
        eviction, options=eviction.options
    )
    model = replay(trace, slots, policy.new_policy(slots))
    buffer = np.zeros(pool.shape, dtype=np.float16)
    pages = buffer.view(np.uint16)
    found = BytesReplay(trace.requests, slots, 0, 0, 0, 0, 0, model, 0.0)
    start = time.perf_counter()
    with build_pipeline(replace(loaded, config=shrunk)) as pipeline:
        pipeline.register_pool("kv", pool, buffer)
        for request in range(trace.requests):
            _one(pipeline, pages, trace, request, found)
    found.seconds = time.perf_counter() - start
    return found


def _one(pipeline: Any, pages: np.ndarray, trace: Trace, request: int, found: BytesReplay) -> None:
    blocks = trace.blocks(request)
    keys = [f"block-{block_id}" for block_id in blocks]
    size = GEOMETRY.page_size
    hits = pipeline.exists(keys)
    found.hit_blocks += hits
    found.hit_tokens += min(trace.block_tokens * hits, trace.inputs[request])
    if hits:
        pages[:, :, : hits * size] = 0
        arrived = pipeline.get(keys[:hits], _indices(0, hits))
        found.pages_restored += sum(arrived)
        for position, block_id in enumerate(blocks[:hits]):
            page = pages[:, :, position * size : (position + 1) * size]
            if arrived[position] and np.array_equal(page, _content(block_id)):
                found.pages_verified += 1
            elif len(found.problems) < _MISMATCHES_KEPT:
                what = "did not arrive" if not arrived[position] else "holds other bytes"
                found.problems.append(
                    f"request {request + 1}: block {block_id} (hit {position + 1} of {hits}) {what}"
                )
    if hits < len(blocks):
        for position in range(hits, len(blocks)):
            pages[:, :, position * size : (position + 1) * size] = _content(blocks[position])
        try:
            stored = pipeline.set(keys[hits:], _indices(hits, len(blocks) - hits))
        except CapacityError:  # no slot for the first block: every one is this write's own
            return
        found.pages_stored += sum(stored)
