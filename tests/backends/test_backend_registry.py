"""Tier backends as plugins: registered through ``kvcr_register_backends``, chosen by name in
configuration (profile, environment, override), options validated by each backend's model."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from kvcr_policy import build_pipeline, load_config
from kvcr_policy.errors import ConfigError
from kvcr_policy.geometry import PoolGeometry
from kvcr_policy.plugins import make_plugin_manager
from kvcr_policy.registry import Registry
from tests.conftest import EXAMPLE_DIST

ProfileWriter = Callable[..., Path]


def test_builtin_backends_are_registered_like_plugins(registry: Registry) -> None:
    dram, peer = registry.get("backend", "dram"), registry.get("backend", "peer")
    assert (dram.plugin, dram.distribution) == ("builtin.dram", "kvcr-policy")
    assert peer.plugin == "builtin.peer"
    # Each built-in backend registers its own transports (and nothing of the other's).
    assert registry.get("transport", "cpu").plugin == "builtin.dram"
    assert registry.get("transport", "ucx").plugin == "builtin.peer"


def test_the_backend_hook_is_traced(capsys: pytest.CaptureFixture[str]) -> None:
    make_plugin_manager(environ={"KVCR_POLICY_TRACE_HOOKS": "1"})
    assert "kvcr_register_backends [hook]" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("transport", "backend", "expected"),
    [
        ("cpu", "auto", "dram"),
        ("memory", "auto", "dram"),
        ("ucx", "auto", "peer"),
        ("cpu", "dram", "dram"),
        ("ucx", "peer", "peer"),
    ],
)
def test_auto_takes_the_backend_of_the_transport(
    registry: Registry, transport: str, backend: str, expected: str
) -> None:
    assert registry.backend_for(backend, transport) == expected


def test_an_unknown_backend_names_the_nearest_and_its_origin(registry: Registry) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(environ={"KVCR_POLICY_BACKEND__NAME": "dramm"}, registry=registry)
    text = str(caught.value)
    assert "backend.name (from env KVCR_POLICY_BACKEND__NAME)" in text
    assert "unknown backend 'dramm'; did you mean 'dram'?" in text


def test_a_backend_takes_no_option_it_does_not_declare(registry: Registry) -> None:
    with pytest.raises(ConfigError, match=r"backend\.options\.size \(from override\)"):
        load_config(overrides={"backend.options.size": 3}, environ={}, registry=registry)


def test_dram_refuses_a_transport_that_is_not_a_copy_transport(registry: Registry) -> None:
    loaded = load_config(
        environ={},
        overrides={
            "backend.name": "dram",
            "transport.name": "ucx",
            "transport.options.peer": "127.0.0.1:1",
        },
        registry=registry,
    )
    with pytest.raises(ConfigError) as caught:  # a configuration that does not fit: ConfigError
        build_pipeline(loaded)
    assert caught.value.issues[0].render() == (
        "transport.name (from override): backend 'dram' moves bytes with a copy transport (cpu, "
        "cuda, memory); transport 'ucx' is not one: choose a copy transport, or "
        "backend.name = 'auto'"
    )


def test_peer_refuses_a_copy_transport(registry: Registry) -> None:
    loaded = load_config(environ={}, overrides={"backend.name": "peer"}, registry=registry)
    with pytest.raises(
        ConfigError, match=r"transport\.name \(from default\).*set transport.name = 'ucx'"
    ):
        build_pipeline(loaded)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"transport.name": "cpu"}, {"coalesce", "split"}),
        ({"transport.name": "memory"}, {"coalesce", "split"}),
        ({"transport.name": "ucx", "transport.options.peer": "127.0.0.1:1"}, {"coalesce", "split"}),
        ({"backend.name": "kvcr"}, set()),
        ({"backend.name": "mooncake", "backend.options.master": "127.0.0.1:1"}, set()),
    ],
)
def test_the_registry_says_what_a_backend_lets_through_without_building_it(
    registry: Registry, overrides: dict[str, object], expected: set[str]
) -> None:
    """``plan`` asks this: the backend's factory answers, whichever backend it is."""
    config = load_config(environ={}, overrides=overrides, registry=registry).config
    assert registry.capabilities(config) == expected


# --- a third-party backend ---


def test_a_third_party_backend_is_selected_by_a_profile_and_validated_by_its_model(
    example_plugin: None, write_profile: ProfileWriter, registry: Registry
) -> None:
    spec = registry.get("backend", "dict")
    assert (spec.plugin, spec.distribution) == ("example", EXAMPLE_DIST)
    path = write_profile(
        """
        [backend]
        name = "dict"

        [backend.options]
        capacity_pages = 8
        """
    )
    loaded = load_config(path, environ={}, registry=registry)
    assert loaded.config.backend.options == {"capacity_pages": 8, "threads": 2, "fail_every": None}
    assert loaded.origin("backend.options.capacity_pages").startswith("profile ")
    assert loaded.origin("backend.options.threads") == "default"
    geo = PoolGeometry("kv", "page_first", 2, 2, 8, "float16", 4, 32)
    pool = np.arange(geo.nbytes // 2, dtype=np.float16).reshape(geo.shape)
    with build_pipeline(loaded) as pipeline:
        pipeline.register_pool("kv", geo, pool)
        assert pipeline.set(["a", "b"], np.arange(8)) == [True, True]
        assert pipeline.stats().pools["kv"]["keys"] == 2
    bad = write_profile(
        '[backend]\nname = "dict"\n[backend.options]\ncapacity_page = 8\n', "bad.toml"
    )
    with pytest.raises(ConfigError, match=r"backend\.options\.capacity_page .*unknown key"):
        load_config(bad, environ={}, registry=registry)
