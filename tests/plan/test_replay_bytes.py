"""The replay with real bytes: the dram tier's hits equal the model's exactly, for every
eviction strategy and any trace, and every restored page holds its block's bytes; a backend
that evicts otherwise is caught."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcr_policy.config.loading import load_config
from kvcr_policy.config.schema import EvictionSection
from kvcr_policy.errors import ArgumentError
from kvcr_policy.plan import replay_bytes as replay_bytes_module
from kvcr_policy.plan.replay_bytes import GEOMETRY, replay_bytes
from kvcr_policy.plan.trace import Trace, read_trace
from kvcr_policy.registry import Registry
from tests.strategies import trace_requests
from tests.support.paths import ROOT

pytestmark = pytest.mark.usefixtures("clean_env")

CONVERSATION = ROOT / "data" / "traces" / "conversation_trace.jsonl.xz"
POLICIES = ["lru", "fifo", "s3fifo"]


def _trace(folder: Path, requests: list[dict[str, object]]) -> Trace:
    path = folder / "trace.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in requests), encoding="utf-8")
    return read_trace(path)


@pytest.mark.parametrize("name", POLICIES)
@settings(max_examples=40)  # each example builds a pipeline: about 20 ms
@given(requests=trace_requests(max_requests=25), capacity=st.integers(1, 10))
def test_the_tier_finds_the_hits_the_model_predicts(
    tmp_path_factory: pytest.TempPathFactory,
    registry: Registry,
    name: str,
    requests: list[dict[str, object]],
    capacity: int,
) -> None:
    trace = _trace(tmp_path_factory.mktemp("trace"), requests)
    loaded = load_config(environ={}, registry=registry)
    found = replay_bytes(loaded, trace, capacity, EvictionSection(strategy=name))
    assert found.agrees, found.to_dict()
    assert found.pages_verified == found.pages_restored == found.hit_blocks


@pytest.mark.parametrize("name", POLICIES)
def test_the_conversation_trace_agrees_while_evicting(registry: Registry, name: str) -> None:
    trace = read_trace(CONVERSATION).head(400)
    loaded = load_config(environ={}, registry=registry)
    found = replay_bytes(loaded, trace, 300, EvictionSection(strategy=name))
    assert found.model.evictions > 1000  # the tier really is too small: eviction decides
    assert found.agrees, found.to_dict()
    assert found.pages_verified == found.hit_blocks > 0
    assert found.tier_pages == 300 and found.to_dict()["page_bytes"] == GEOMETRY.page_bytes == 512


def test_a_backend_that_evicts_otherwise_is_caught(registry: Registry) -> None:
    """The example's dict backend evicts as it sees fit (and keeps its own page count): the
    hits differ from the model's, and the replay says so rather than agreeing."""
    trace = read_trace(CONVERSATION).head(400)
    overrides = {"backend.name": "dict", "backend.options.capacity_pages": 40}
    loaded = load_config(environ={}, overrides=overrides, registry=registry)
    found = replay_bytes(loaded, trace, 300, EvictionSection(strategy="lru"))
    assert not found.agrees
    assert found.hit_blocks != found.model.hit_blocks
    assert found.pages_verified == found.pages_restored  # what it did restore is right


def test_a_replay_larger_than_its_bound_is_refused_not_mapped(
    registry: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(replay_bytes_module, "MAX_BYTES", 100 * GEOMETRY.page_bytes)
    trace = read_trace(CONVERSATION).head(10)
    loaded = load_config(environ={}, registry=registry)
    with pytest.raises(ArgumentError, match=r"--bytes 10: the replay with real bytes would map"):
        replay_bytes(loaded, trace, 1000, EvictionSection(strategy="lru"))
