"""Tests for kvcr_policy.config.schema: upstream defaults, frozen and closed types, positional
order."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from kvcr_policy.config.order import schemas_dir
from kvcr_policy.config.schema import (
    POSITIONAL_TYPES,
    BatchingSection,
    CoalescingSection,
    PlacementSection,
    PolicyConfig,
    ThreadTuningSection,
)


def test_defaults_reproduce_upstream() -> None:
    config = PolicyConfig()
    assert (config.batching.strategy, config.batching.read_batch_pages) == ("fixed", 128)
    assert config.batching.query_batch_keys == 128
    assert (config.batching.window_batches, config.batching.window_pages) == (None, None)
    assert config.batching.window_bytes is None
    assert (config.coalescing.strategy, config.coalescing.split_bytes) == ("none", None)
    assert (config.placement.huge_pages, config.placement.numa_policy) == ("off", "none")
    assert config.placement.prefault is False
    assert config.thread_tuning.switch_interval_s is None
    assert (config.fallback.strategy, config.transport.name) == ("sparse", "cpu")


def test_config_is_frozen() -> None:
    config = PolicyConfig()
    with pytest.raises(ValidationError, match="frozen"):
        config.batching.read_batch_pages = 64  # type: ignore[misc]
    with pytest.raises(ValidationError, match="frozen"):
        config.batching = BatchingSection()  # type: ignore[misc]
    assert config.batching.read_batch_pages == 128


@pytest.mark.parametrize("cls", POSITIONAL_TYPES, ids=lambda cls: cls.__name__)
def test_unknown_keys_are_forbidden(cls: type[PolicyConfig]) -> None:
    with pytest.raises(ValidationError) as caught:
        cls(no_such_field=1)
    assert [e["type"] for e in caught.value.errors()] == ["extra_forbidden"]


def test_positional_arguments_bind_in_declared_order() -> None:
    section = BatchingSection("fixed", 64, 32, 4)
    assert section.read_batch_pages == 64
    assert section.query_batch_keys == 32
    assert section.window_batches == 4
    assert section.window_pages is None


@pytest.mark.parametrize("cls", POSITIONAL_TYPES, ids=lambda cls: cls.__name__)
def test_positional_order_is_the_pinned_order(cls: type[PolicyConfig]) -> None:
    pinned = json.loads((schemas_dir() / "field-order.json").read_text(encoding="utf-8"))
    default = cls()
    args = [getattr(default, name) for name in pinned[cls.__name__]]
    assert cls(*args) == default


def test_positional_and_keyword_mix() -> None:
    section = CoalescingSection("contiguous", on_unsupported="error")
    assert (section.strategy, section.on_unsupported) == ("contiguous", "error")


def test_too_many_positional_arguments_are_refused() -> None:
    with pytest.raises(TypeError, match=r"at most 3 positional arguments .* got 4"):
        ThreadTuningSection("switch_interval", None, {}, "extra")


def test_an_argument_given_twice_is_refused() -> None:
    with pytest.raises(TypeError, match="'strategy' both by position and by name"):
        BatchingSection("fixed", strategy="fixed")


def test_positional_values_are_validated() -> None:
    with pytest.raises(ValidationError, match="read_batch_pages"):
        BatchingSection("fixed", 0)


def test_byte_sizes_accept_units() -> None:
    assert BatchingSection(window_bytes="1GiB").window_bytes == 1 << 30
    assert PlacementSection(capacity_bytes="64MiB").capacity_bytes == 64 << 20


def test_window_pages_below_batch_names_both_fields() -> None:
    with pytest.raises(ValidationError) as caught:
        BatchingSection(read_batch_pages=64, window_pages=32)
    message = str(caught.value)
    assert "batching.window_pages (32)" in message
    assert "batching.read_batch_pages (64)" in message
    assert BatchingSection(read_batch_pages=64, window_pages=64).window_pages == 64


@pytest.mark.parametrize(
    ("policy", "nodes", "needle"),
    [
        ("bind", (), "numa_policy 'bind' needs placement.numa_nodes"),
        ("none", (0,), "numa_nodes [0] is set but placement.numa_policy is 'none'"),
        ("preferred", (0, 1), "'preferred' takes exactly one node"),
    ],
)
def test_numa_nodes_must_match_the_policy(policy: str, nodes: tuple[int, ...], needle: str) -> None:
    with pytest.raises(ValidationError) as caught:
        PlacementSection(numa_policy=policy, numa_nodes=nodes)
    assert needle in str(caught.value)


@pytest.mark.parametrize("policy", ["bind", "interleave"])
def test_numa_policies_with_nodes_are_valid(policy: str) -> None:
    assert PlacementSection(numa_policy=policy, numa_nodes=(0, 1)).numa_nodes == (0, 1)


@pytest.mark.parametrize("value", [0, -1e-3, 1.5])
def test_switch_interval_is_bounded(value: float) -> None:
    with pytest.raises(ValidationError, match="switch_interval_s"):
        ThreadTuningSection(switch_interval_s=value)
