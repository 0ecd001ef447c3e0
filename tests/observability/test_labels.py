"""Pool names as label values: valid, bounded in length and in number per owner, each label
that is not the name itself logged once with the pool it stands for."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest

from kvcr_policy.observability.labels import MAX_POOL_LABELS, OTHER, PoolLabels, pool_label
from kvcr_policy.observability.meters import Meters

LABEL = re.compile(r"[A-Za-z0-9._:-]{1,64}")


@given(st.lists(st.text(max_size=80), max_size=60))
def test_an_owner_gets_bounded_valid_labels_and_keeps_them(names: list[str]) -> None:
    labels = PoolLabels("test")
    given_ = [labels.label(name) for name in names]
    assert all(LABEL.fullmatch(label) for label in given_)
    assert len(set(given_) - {OTHER}) <= MAX_POOL_LABELS
    assert [labels.label(name) for name in names] == given_  # the same name, the same label
    own = [name for name in dict.fromkeys(names) if labels.label(name) != OTHER]
    assert len({labels.label(name) for name in own}) == len(own)  # none shared but other
    assert pool_label(OTHER) != OTHER  # a pool named "other" cannot pass for the overflow


def test_a_pipelines_meters_label_at_most_the_bound_and_log_the_mapping(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("INFO", "kvcr_policy.observability")
    registry = CollectorRegistry()
    meters = Meters(True, "dram", "test", registry)
    try:
        for i in range(40):
            meter = meters.open(f"pool {i} " + "x" * 100)
            assert meter is not None
            meter.exists(1, 1, 0.001)
        assert meters.open("kv") is not None  # past the bound: plain names go to other too
        page = generate_latest(registry).decode()
        pools = set(re.findall(r'pool="([^"]*)"', page))
        assert len(pools) == MAX_POOL_LABELS + 1 and OTHER in pools
        assert "stands for pool 'pool 0 xxx" in caplog.text
        assert "has 16 pool labels already" in caplog.text
    finally:
        meters.close()
