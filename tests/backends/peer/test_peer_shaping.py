"""Descriptor lists shaped by the client's coalescing strategy, checked by the server, over real
ucxx on loopback: a third-party strategy takes effect on reads and writes; a buggy strategy costs
misses, never bytes; a client naming bytes outside its claim or reservation is refused."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from kvcr_policy.backends.peer.wire import messages as m
from kvcr_policy.backends.peer.wire.coverage import Cover
from tests.backends.peer.raw_client import Raw, default_secret
from tests.support.pools import fresh_keys, geometry, pages_of, pool_buffer, token_indices

pytestmark = pytest.mark.ucx

THIRDS = '''
from kvcr_policy import hookimpl
from kvcr_policy.descriptors import Descriptors, coalesce

CALLS = []


class Thirds:
    """Merges runs (where allowed), then cuts every descriptor into 3 pieces, last first."""

    needs = frozenset({"coalesce", "split"})

    def __init__(self, section, options):
        pass

    def prepare(self, d, allowed):
        if "coalesce" in allowed:
            d = coalesce(d)
        if "split" not in allowed:
            return d
        parts = []
        for k in range(3):
            start = d.length * k // 3
            end = d.length * (k + 1) // 3
            parts.append(Descriptors(
                src=d.src + start, dst=d.dst + start, length=end - start,
                bound=d.bound, page=d.page, page_end=d.page_end,
            ))
        out = Descriptors.concat(*reversed(parts))
        out = out.take(out.length > 0)
        CALLS.append((len(d), len(out)))
        return out


class Shifty(Thirds):
    """A buggy strategy: sends the first descriptor's bytes one byte further."""

    def prepare(self, d, allowed):
        out = super().prepare(d, allowed)
        dst = out.dst.copy()
        dst[0] += 1
        return Descriptors(out.src, dst, out.length, out.bound, out.page, out.page_end)


class Junk(Thirds):
    """A buggy strategy: returns something that is not Descriptors."""

    def prepare(self, d, allowed):
        return list(super().prepare(d, allowed).src)


class Raising(Thirds):
    """A buggy strategy: raises."""

    def prepare(self, d, allowed):
        raise ZeroDivisionError("a bug")


@hookimpl
def kvcr_register_strategies(register):
    register("coalescing", "thirds", Thirds, description="test: cut in three")
    register("coalescing", "shifty", Shifty, description="test: misroutes a byte")
    register("coalescing", "junk", Junk, description="test: returns a list")
    register("coalescing", "raising", Raising, description="test: raises")
'''


@pytest.fixture
def thirds(fake_dist: Any) -> Any:
    """A third-party distribution registering coalescing strategies ``thirds`` and buggy ones."""
    fake_dist("kvcr-test-thirds", {"thirds": "kvcr_test_thirds"}, {"kvcr_test_thirds": THIRDS})
    import kvcr_test_thirds  # type: ignore[import-not-found]

    return kvcr_test_thirds


@pytest.mark.parametrize(
    ("layout", "mla"),
    [("layer_first", False), ("page_first", False), ("page_head", False), ("layer_first", True)],
)
def test_a_third_party_strategy_shapes_reads_and_writes_byte_exact(
    connect: Any, thirds: Any, layout: str, mla: bool
) -> None:
    geo = geometry(layout, pages=16, mla=mla, name=f"thirds-{layout}-{mla}")
    pipeline = connect(**{"coalescing.strategy": "thirds"})
    buffer = pool_buffer(geo, 11)
    pipeline.register_pool(geo.name, geo, buffer)
    keys = fresh_keys(6)
    src = np.array([3, 4, 5, 0, 9, 10])  # runs and a scattered page
    view = pages_of(buffer, geo)
    stored = view[:, src].copy()
    assert pipeline.set(keys, token_indices(src, geo.page_size), geo.name) == [True] * 6
    writes = list(thirds.CALLS)
    dst = np.array([15, 14, 12, 13, 6, 7])
    view[:, dst] = 0
    assert pipeline.get(keys, token_indices(dst, geo.page_size), geo.name) == [True] * 6
    assert np.array_equal(view[:, dst], stored)
    reads = thirds.CALLS[len(writes) :]
    assert writes and reads, "the strategy was not used for both directions"
    assert all(out == 3 * n for n, out in thirds.CALLS)  # every descriptor was cut in three


@pytest.mark.parametrize("strategy", ["shifty", "junk", "raising"])
def test_a_buggy_strategy_never_moves_a_wrong_byte(
    connect: Any, thirds: Any, strategy: str, caplog: Any
) -> None:
    """Every batch shaped by a buggy strategy fails before a byte moves; the fallback then
    retries page by page with plain descriptors, so the pages arrive exact."""
    geo = geometry(pages=8, name="shifty")
    writer = connect(**{"coalescing.strategy": "thirds"})
    buffer = pool_buffer(geo, 12)
    writer.register_pool("shifty", geo, buffer)
    keys = fresh_keys(3)
    assert writer.set(keys, token_indices(range(3), geo.page_size), "shifty") == [True] * 3

    buggy = connect(**{"coalescing.strategy": strategy, "batching.read_batch_pages": 3})
    other = pool_buffer(geo, 13)
    buggy.register_pool("shifty", geo, other)
    expected = other.copy()
    expected_pages = pages_of(expected, geo)
    expected_pages[:, 4:7] = pages_of(buffer, geo)[:, 0:3]
    with caplog.at_level("WARNING"):
        assert buggy.get(keys, token_indices(range(4, 7), geo.page_size), "shifty") == [True] * 3
    assert np.array_equal(other.view(np.uint8), expected.view(np.uint8))  # exact, nothing else
    assert "coalescing strategy" in caplog.text  # the failed batch says why
    assert sum(buggy.stats().fallbacks.values()) == 3  # one batch of 3 pages fell back
    fresh = fresh_keys(2)
    assert buggy.set(fresh, token_indices(range(2), geo.page_size), "shifty") == [True, True]
    assert writer.get(fresh, token_indices(range(5, 7), geo.page_size), "shifty") == [True, True]
    assert np.array_equal(pages_of(buffer, geo)[:, 5:7], pages_of(expected, geo)[:, 0:2])
    tier = writer.stats().to_dict()["pools"]["shifty"]["peer"]["remote"]["tier"]
    assert tier["claimed"] == 0 and tier["reserved"] == 0
    assert writer.exists(keys, "shifty") == 3  # the peer still serves


# ---- a hostile client on a raw socket -------------------------------------------------------


def _attach(raw: Raw, geo: Any) -> tuple[int, Any]:
    g = geo
    attach = m.Attach(
        g.name, g.layout, g.layers, g.heads, g.head_dim, g.dtype, g.page_size, g.tokens, g.mla, 0
    )
    reply = raw.ask(attach)
    assert isinstance(reply, m.Attached), reply
    return reply.pool, replace(geo, tokens=reply.slots * geo.page_size)


def _outside(cover: Cover, tier: Any, how: str) -> tuple[np.ndarray, np.ndarray]:
    offsets, lengths = cover.ranges()
    if how == "another slot":  # the first fragment's bytes of a slot not claimed
        taken = set(cover.fragments.tolist())
        other = next(i for i in range(tier.pages) if i not in taken)
        offsets[0] = other * tier.fragment_bytes
    elif how == "past the tier":
        offsets[0] = tier.nbytes - 1
    elif how == "overlap":  # one fragment twice, another never
        offsets[1] = offsets[0]
    else:  # "one byte more": the claimed bytes and one after them
        lengths[0] += 1
    return offsets, lengths


@pytest.mark.parametrize("how", ["another slot", "past the tier", "overlap", "one byte more"])
def test_descriptors_outside_the_claim_are_refused(
    peer: Any, connect: Any, worker: Any, how: str
) -> None:
    geo = geometry(pages=8, name="hostile")
    pipeline = connect()
    pipeline.register_pool("hostile", geo, pool_buffer(geo, 14))
    keys = fresh_keys(2)
    assert pipeline.set(keys, token_indices(range(2), geo.page_size), "hostile") == [True, True]

    raw = Raw(peer.address)
    assert isinstance(raw.handshake(default_secret(), worker.address), m.Welcome)
    number, tier = _attach(raw, geo)

    claimed = raw.ask(m.Claim(number, keys, np.arange(2, dtype=np.int64)))
    assert isinstance(claimed, m.Claimed) and len(claimed.slots) == 2
    offsets, lengths = _outside(Cover.of_pages(tier, claimed.slots), tier, how)
    refused = raw.ask(m.Send(claimed.claim, 1, offsets, lengths))
    assert refused is None or (isinstance(refused, m.Error) and refused.code == m.Err.BAD_REQUEST)

    if refused is not None:  # the connection stays; a write outside its slots fares the same
        reserved = raw.ask(m.Reserve(number, fresh_keys(2), np.arange(2, dtype=np.int64), 0, []))
        assert isinstance(reserved, m.Reserved)
        offsets, lengths = _outside(Cover.of_pages(tier, reserved.slots), tier, how)
        posted = raw.ask(m.Post(reserved.reservation, offsets, lengths))
        assert isinstance(posted, m.Error) and posted.code == m.Err.BAD_REQUEST
    raw.sock.close()

    tier_stats = pipeline.stats().to_dict()["pools"]["hostile"]["peer"]["remote"]["tier"]
    assert tier_stats["claimed"] == 0 and tier_stats["reserved"] == 0
    assert peer.proc.poll() is None, "the server died"
    again = pool_buffer(geo, 15)
    reader = connect()
    reader.register_pool("hostile", geo, again)
    assert reader.get(keys, token_indices(range(4, 6), geo.page_size), "hostile") == [True, True]
    assert np.array_equal(pages_of(again, geo)[:, 4:6], pages_of(pool_buffer(geo, 14), geo)[:, :2])
