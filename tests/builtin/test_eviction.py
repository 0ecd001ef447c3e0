"""Eviction as a strategy kind: configured, validated and shown like any strategy; the older
``placement.eviction`` keeps working; every registered policy keeps the store's contract; a
pipeline's tier evicts as the configured strategy says."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given

from kvcr_policy.config.loading import load_config
from kvcr_policy.config.schema import EvictionSection, PlacementSection, PolicyConfig, strategy_name
from kvcr_policy.errors import ConfigError
from kvcr_policy.pipeline import build_pipeline
from kvcr_policy.registry import Registry
from kvcr_policy.strategies import EvictionPolicy
from tests.strategies import eviction_ops
from tests.support.commands import run_main
from tests.support.pools import geometry, pool_buffer, token_indices

pytestmark = pytest.mark.usefixtures("clean_env")

ProfileWriter = Callable[..., Path]


def test_lru_is_the_default_and_its_origin_is_the_default(registry: Registry) -> None:
    loaded = load_config(environ={}, registry=registry)
    assert loaded.config.eviction.strategy == "lru"
    assert loaded.origin("eviction.strategy") == "default"


def test_placement_eviction_is_honoured_when_the_section_is_unset(registry: Registry) -> None:
    env = {"KVCR_POLICY_PLACEMENT__EVICTION": "fifo"}
    loaded = load_config(environ=env, registry=registry)
    assert loaded.config.eviction.strategy == "fifo"
    assert loaded.origin("eviction.strategy") == "env KVCR_POLICY_PLACEMENT__EVICTION"


def test_the_same_name_in_both_places_is_accepted(
    registry: Registry, write_profile: ProfileWriter
) -> None:
    path = write_profile('[placement]\neviction = "fifo"\n[eviction]\nstrategy = "fifo"\n')
    loaded = load_config(path, environ={}, registry=registry)
    assert loaded.config.eviction.strategy == "fifo"


def test_two_different_names_are_one_error_naming_both_origins(
    registry: Registry, write_profile: ProfileWriter
) -> None:
    path = write_profile('[placement]\neviction = "fifo"\n')
    env = {"KVCR_POLICY_EVICTION__STRATEGY": "lru"}
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ=env, registry=registry)
    (issue,) = caught.value.issues
    assert issue.path == "eviction"
    assert "eviction.strategy 'lru' (from env KVCR_POLICY_EVICTION__STRATEGY)" in issue.message
    assert f"placement.eviction 'fifo' (from profile {path} [placement])" in issue.message
    assert "drop placement.eviction, or give both the same name" in issue.message


def test_a_config_built_in_python_is_held_to_the_same_rule() -> None:
    with pytest.raises(ValueError, match="name different eviction strategies"):
        PolicyConfig(placement=PlacementSection(eviction="fifo"), eviction=EvictionSection("lru"))
    plain = PolicyConfig(placement=PlacementSection(eviction="fifo"))
    assert strategy_name(plain, "eviction") == "fifo"  # unset: the older spelling


def test_an_unknown_strategy_names_the_registered_ones(registry: Registry) -> None:
    with pytest.raises(ConfigError, match=r"unknown eviction strategy 'lrv'; did you mean 'lru'"):
        load_config(environ={}, overrides={"eviction.strategy": "lrv"}, registry=registry)


def test_options_are_validated_by_the_strategy(registry: Registry) -> None:
    overrides = {"eviction.strategy": "lru", "eviction.options.size": 3}
    with pytest.raises(ConfigError, match=r"eviction\.options\.size \(from override\)"):
        load_config(environ={}, overrides=overrides, registry=registry)


def test_show_prints_the_strategy_and_its_origin(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main(capsys, "show", "--format", "json", "--set", "eviction.strategy=fifo")
    assert code == 0
    shown = json.loads(out)
    assert shown["config"]["eviction"] == {"strategy": "fifo", "options": {}}
    assert shown["origins"]["eviction.strategy"] == "override"


# ---- the policies' contract, for every registered one (the example plugin's included) ----


def test_the_built_ins_and_the_example_are_registered(registry: Registry) -> None:
    assert {"lru", "fifo", "s3fifo"} <= set(registry.names("eviction"))


@pytest.mark.parametrize("name", ["lru", "fifo", "s3fifo"])
@given(ops=eviction_ops())
def test_victims_are_held_evictable_distinct_and_as_many_as_asked(
    registry: Registry, name: str, ops: list[tuple[str, int, int]]
) -> None:
    loaded = load_config(environ={}, overrides={"eviction.strategy": name}, registry=registry)
    config = loaded.config
    strategy = registry.get("eviction", name).create(config.eviction, options={})
    policy: EvictionPolicy = strategy.new_policy(16)
    held: list[int] = []
    slot = 0
    for op, a, b in ops:
        if op == "admit" and len(held) < 16:
            policy.admit(slot, f"k{slot % 23}")  # keys come back, as in a ghost's life
            held.append(slot)
            slot += 1
        elif op == "touch" and held:
            policy.touch(held[a % len(held)])
        elif op == "forget" and held:
            policy.forget(held.pop(a % len(held)))
        elif op == "victims":
            allowed = {s for i, s in enumerate(held) if b >> i & 1}
            count = a % 8
            chosen = policy.victims(count, allowed.__contains__)
            assert len(chosen) == len(set(chosen)) == min(count, len(allowed))
            assert set(chosen) <= allowed
            for victim in chosen:  # the store forgets each victim
                policy.forget(victim)
                held.remove(victim)


# ---- a real pipeline's tier evicts as configured ----


def _survivors(registry: Registry, overrides: dict[str, object]) -> list[str]:
    """Two-page tier: store a, b; read a; store c. Which of a, b, c are left?"""
    geo = geometry(pages=4)
    loaded = load_config(
        environ={},
        overrides={"placement.capacity_bytes": 2 * geo.page_bytes, **overrides},
        registry=registry,
    )
    with build_pipeline(loaded) as pipeline:
        pipeline.register_pool("kv", geo, pool_buffer(geo))
        for key, page in (("a", 0), ("b", 1)):
            assert pipeline.set([key], token_indices([page], geo.page_size)) == [True]
        pipeline.get(["a"], token_indices([2], geo.page_size))
        assert pipeline.set(["c"], token_indices([3], geo.page_size)) == [True]
        return [key for key in "abc" if pipeline.exists([key]) == 1]


@pytest.mark.parametrize(
    ("overrides", "left"),
    [
        ({}, ["a", "c"]),  # lru, the default: b was used least lately
        ({"placement.eviction": "fifo"}, ["b", "c"]),  # the older spelling still works
        ({"eviction.strategy": "fifo"}, ["b", "c"]),
        # s3fifo: a was read while new, so it moves to the main queue; b leaves.
        ({"eviction.strategy": "s3fifo"}, ["a", "c"]),
        # ... unless it takes two reads to move.
        ({"eviction.strategy": "s3fifo", "eviction.options.promote_reads": 2}, ["b", "c"]),
    ],
)
def test_the_tier_evicts_as_the_strategy_says(
    registry: Registry, overrides: dict[str, object], left: list[str]
) -> None:
    assert _survivors(registry, overrides) == left


def test_each_pool_gets_a_policy_of_its_own(registry: Registry) -> None:
    geo = geometry(pages=2)
    overrides = {"eviction.strategy": "s3fifo", "placement.capacity_bytes": geo.page_bytes}
    loaded = load_config(environ={}, overrides=overrides, registry=registry)
    with build_pipeline(loaded) as pipeline:
        for name in ("kv", "mamba"):
            pipeline.register_pool(name, geo, pool_buffer(geo))
        pools = pipeline.stats().pools
        assert [pools[name]["eviction"] for name in ("kv", "mamba")] == ["s3fifo", "s3fifo"]
        # One policy each: filling one pool's tier evicts nothing from the other's.
        for key, name in (("a", "kv"), ("b", "mamba"), ("c", "kv")):
            pipeline.set([key], token_indices([0], geo.page_size), pool=name)
        assert pipeline.exists(["b"], pool="mamba") == 1
        assert pipeline.stats().pools["mamba"]["store"]["evictions"] == 0
