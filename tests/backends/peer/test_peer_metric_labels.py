"""What a peer server's ``/metrics`` says of its tenants and pools (red team 2026-12-b, B5): no
tenant name unless ``observability.tenant_labels``, label values bounded and valid whatever a
client names its pool, one tenant's series never another's, and a closed server's tiers gone.

The end-to-end test runs a real ``kvcr-policy serve --metrics`` with two tenants, one of them
named ``default`` (such a tenant once got unprefixed labels and overwrote team-b's gauges with a
pool named ``team-b/kv``), whose clients ATTACH by hand over authenticated sessions.
"""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest

from kvcr_policy.backends.peer.credentials import Keyring, Tenant
from kvcr_policy.backends.peer.server.labels import pool_label, tenant_labels
from kvcr_policy.backends.peer.server.meter import ServerMeter
from kvcr_policy.backends.peer.wire import messages as m
from kvcr_policy.backends.reporting import TierUsage
from tests.backends.peer.raw_client import Raw
from tests.backends.peer.tenants import start_peer, tenants_dir
from tests.observability.scraping import read_samples

LABEL = re.compile(r"[A-Za-z0-9._:-]{1,64}")
OPAQUE = re.compile(r"tenant-[0-9a-f]{8}/[A-Za-z0-9._:-]{1,64}")


@given(st.text(max_size=300))
def test_a_pool_label_is_bounded_valid_and_its_own(name: str) -> None:
    label = pool_label(name)
    assert LABEL.fullmatch(label), label
    assert label == name or (label.startswith("pool-") and label != pool_label(name + "x"))


def test_a_pool_label_keeps_plain_names_and_hashes_the_rest() -> None:
    assert pool_label("kv") == "kv"
    assert pool_label("mla-kv_0.tier:1") == "mla-kv_0.tier:1"
    for odd in ("", "n" * 256, "a\x00b", 'a"b\n', "team-b/kv", "\u4e00"):
        assert re.fullmatch(r"pool-[0-9a-f]{8}", pool_label(odd)), odd


def _keyring(*names: str) -> Keyring:
    return Keyring({n.encode(): Tenant(n, f"secret of {n}".encode()) for n in names})


def test_tenants_are_opaque_unless_named_and_never_unprefixed() -> None:
    ring = _keyring("default", "team-b")
    opaque = tenant_labels(ring, tenants_dir=True, named=False)
    assert set(opaque) == {"default", "team-b"}
    for label in opaque.values():
        assert re.fullmatch(r"tenant-[0-9a-f]{8}", label)
    assert len(set(opaque.values())) == 2
    assert opaque == tenant_labels(_keyring("default", "team-b"), True, False)  # stable
    assert tenant_labels(ring, True, named=True) == {"default": "default", "team-b": "team-b"}
    assert tenant_labels(_keyring("default"), tenants_dir=False, named=False) == {}


class _Tier:
    """A server tier as the meter reads it (name, usage(), store.stats().claimed)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.store = type("S", (), {"stats": lambda _: type("T", (), {"claimed": 2})()})()

    def usage(self) -> TierUsage:
        return TierUsage(4096, 1024, 3)


def test_a_closed_servers_tier_series_are_gone_from_the_page() -> None:
    registry = CollectorRegistry()
    meter = ServerMeter("labels", ["exists"], registry)
    other = ServerMeter("other", ["exists"], registry)
    meter.tier(_Tier("tenant-0a1b2c3d/kv"))
    other.tier(_Tier("kv"))
    before = generate_latest(registry).decode()
    assert 'pool="tenant-0a1b2c3d/kv"' in before and 'pool="kv",profile="other"' in before
    meter.close()
    after = generate_latest(registry).decode()
    assert "tenant-0a1b2c3d" not in after  # not a series of 0: gone
    assert 'capacity_bytes{backend="peer-server",pool="kv",profile="other"} 4096' in after


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Path]]:
    folder = tenants_dir(tmp_path_factory.mktemp("labels"), ("default", "team-b"))
    peer = start_peer(folder, args=("--metrics", "0"))
    yield peer, folder
    peer.stop()


def _attach(peer: Any, worker: Any, secret: bytes, *names: str) -> list[m.Message | None]:
    answers = []
    with Raw(peer.address) as raw:
        assert isinstance(raw.handshake(secret, worker.address), m.Welcome)
        for name in names:
            attached = raw.ask(m.Attach(name, "layer_first", 3, 2, 16, "float16", 4, 32, False, 0))
            answers.append(attached)
            if isinstance(attached, m.Attached):
                assert isinstance(raw.ask(m.Exists(attached.pool, ["k"])), m.Count)
    return answers


@pytest.mark.ucx
def test_metrics_name_no_tenant_and_take_no_label_from_a_client(
    served: tuple[Any, Path], worker: Any
) -> None:
    peer, folder = served
    secret = {n: (folder / n).read_text().strip().encode() for n in ("default", "team-b")}
    mine = _attach(peer, worker, secret["default"], "kv", "team-b/kv", "n" * 256, "a\x00b", "")
    assert [type(a) for a in mine] == [m.Attached] * 3 + [m.Error] * 2  # NUL, empty: refused
    assert isinstance(_attach(peer, worker, secret["team-b"], "kv")[0], m.Attached)
    with urllib.request.urlopen(peer.info["metrics"], timeout=10) as reply:
        page = reply.read().decode().replace('profile="default"', "")  # the profile's name
    assert "default" not in page and "team-b" not in page and "nnnn" not in page
    pools = {
        dict(labels)["pool"]
        for (name, labels) in read_samples(peer.info["metrics"])
        if name == "kvcr_policy_tier_capacity_bytes"
    }
    assert len(pools) == 4, pools  # default's kv, team-b/kv, n*256; team-b's own kv
    assert all(OPAQUE.fullmatch(pool) for pool in pools), pools
    kv = {pool for pool in pools if pool.endswith("/kv")}
    assert len(kv) == 2  # the same pool name of two tenants: two series, neither overwritten


def test_a_tenants_pool_labels_are_bounded_and_shared_tiers_add_up(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Round 2's cardinality left over (red team 2026-12-c): 60 pools of long names grew
    /metrics from 103 to 9,527 lines. A tenant now gets MAX_POOL_LABELS label values; its tiers
    past them share ``other``, whose gauges add theirs up, and each label is logged with the
    pool it stands for. Two tiers of one pool name (two layouts) count apart, not overwritten."""
    from kvcr_policy.backends.peer.server.tiers import Tiers
    from kvcr_policy.builtin.placement import AnonymousPlacement
    from kvcr_policy.config.schema import PlacementSection
    from kvcr_policy.observability.labels import MAX_POOL_LABELS
    from kvcr_policy.registry import NoOptions
    from tests.support.pools import geometry

    geo = geometry(pages=4)
    placement = AnonymousPlacement(PlacementSection(), NoOptions())
    tiers = Tiers(placement, 4 * geo.page_bytes, 64, None, labels={"mallory": "tenant-0a1b2c3d"})
    registry = CollectorRegistry()
    meter = ServerMeter("labels", ["exists"], registry)
    caplog.set_level("INFO", "kvcr_policy.observability")
    try:
        opened = [tiers.open("mallory", replace(geo, name="n" * 200 + str(i))) for i in range(40)]
        opened.append(tiers.open("mallory", replace(geo, name="n" * 200 + "0", page_size=8)))
        for tier in opened:
            meter.tier(tier)
        page = generate_latest(registry).decode()
        capacity = {
            line.split('pool="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
            for line in page.splitlines()
            if line.startswith("kvcr_policy_tier_capacity_bytes{")
        }
        assert len(capacity) == MAX_POOL_LABELS + 1, sorted(capacity)  # and "other"
        assert all(OPAQUE.fullmatch(label) for label in capacity), capacity
        other = "tenant-0a1b2c3d/other"
        assert capacity[other] == sum(t.usage().capacity_bytes for t in opened if t.name == other)
        first = opened[0].name
        assert (
            capacity[first] == opened[0].usage().capacity_bytes + opened[-1].usage().capacity_bytes
        )
        assert f"metrics label pool='{first.split('/')[1]}' stands for pool" in caplog.text
        assert "pool 'other' stands for" not in caplog.text or "labels already" in caplog.text
    finally:
        meter.close()
        tiers.close()
