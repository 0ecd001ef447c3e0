"""The ``mooncake`` backend's options: its own model, every option from ``KVCR_POLICY_*``, clear
errors; and what building it says where Mooncake is missing. No master is needed here."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

import pytest

from kvcr_policy import build_pipeline, load_config
from kvcr_policy.config.loading import LoadedConfig
from kvcr_policy.errors import ConfigError, PluginError
from kvcr_policy.registry import Registry
from tests.plugins.mooncake.mooncake_helpers import PLUGIN_DIST
from tests.support.installs import missing
from tests.support.paths import ROOT

ENV = "KVCR_POLICY_BACKEND__OPTIONS__"


@pytest.fixture(autouse=True)
def _plugin() -> None:
    try:
        metadata.distribution(PLUGIN_DIST)
    except metadata.PackageNotFoundError:
        missing(f"{PLUGIN_DIST} is not installed; pip install -e plugins/kvcr-policy-mooncake")


def loaded(**env: str) -> LoadedConfig:
    environ = {"KVCR_POLICY_BACKEND__NAME": "mooncake", **env}
    return load_config(environ=environ, dotenv=False)


def test_the_plugin_registers_backend_mooncake(registry: Registry) -> None:
    spec = registry.get("backend", "mooncake")
    assert (spec.plugin, spec.distribution) == ("mooncake", PLUGIN_DIST)


def test_every_option_is_settable_from_the_environment() -> None:
    values = {
        "MASTER": "10.1.2.3:50051",
        "METADATA": "http://10.1.2.3:8080/metadata",
        "PROTOCOL": "rdma",
        "DEVICE": "mlx5_0,mlx5_1",
        "LOCAL_HOSTNAME": "10.1.2.4",
        "SEGMENT_BYTES": "8GiB",
        "BUFFER_BYTES": "64MiB",
        "REPLICAS": "2",
        "PREFERRED_SEGMENT": "local",
        "TENANT": "team-a",
        "CONNECT_TIMEOUT_S": "3.5",
        "THREADS": "8",
        "CALL_BUFFERS": "512",
        "RECHECK_S": "0.25",
        "STAGING": "auto",
        "STAGING_BYTES": "64MiB",
        "STAGING_BELOW_BYTES": "256KiB",
        "CALL_PRIORITY": "idle",
    }
    config = loaded(**{ENV + name: value for name, value in values.items()})
    options = config.config.backend.options
    assert options == {
        "master": "10.1.2.3:50051",
        "metadata": "http://10.1.2.3:8080/metadata",
        "protocol": "rdma",
        "device": "mlx5_0,mlx5_1",
        "local_hostname": "10.1.2.4",
        "segment_bytes": 8 << 30,
        "buffer_bytes": 64 << 20,
        "replicas": 2,
        "preferred_segment": "local",
        "tenant": "team-a",
        "connect_timeout_s": 3.5,
        "threads": 8,
        "call_buffers": 512,
        "recheck_s": 0.25,
        "staging": "auto",
        "staging_bytes": 64 << 20,
        "staging_below_bytes": 256 << 10,
        "call_priority": "idle",
    }
    for name in values:
        path = f"backend.options.{name.lower()}"
        assert config.origin(path) == f"env {ENV}{name}"


def test_defaults_need_only_the_master_and_a_profile_table_works(
    write_profile: Callable[..., Path],
) -> None:
    path = write_profile(
        """
        [backend]
        name = "mooncake"

        [backend.options]
        master = "127.0.0.1:50051"
        """
    )
    config = load_config(path, environ={}, dotenv=False)
    options = config.config.backend.options
    assert options["protocol"] == "tcp" and options["metadata"] == "P2PHANDSHAKE"
    assert options["segment_bytes"] == 4 << 30 and options["replicas"] == 1
    assert config.origin("backend.options.master").startswith("profile ")


@pytest.mark.parametrize(
    ("env", "path", "says"),
    [
        ({}, "backend.options.master", "field required"),
        ({ENV + "MASTER": "no-port"}, "backend.options.master", "HOST:PORT"),
        ({ENV + "MASTER": "h:99999"}, "backend.options.master", "1..65535"),
        ({ENV + "SEGMENT_BYTES": "1MiB"}, "backend.options.segment_bytes", "at least 16MiB"),
        ({ENV + "PROTOCOL": "udp"}, "backend.options.protocol", "'tcp' or 'rdma'"),
        ({ENV + "REPLICAS": "0"}, "backend.options.replicas", "greater than or equal to 1"),
        ({ENV + "CALL_PRIORITY": "low"}, "backend.options.call_priority", "'idle' or 'auto'"),
        ({ENV + "SEGMNT_BYTES": "1GiB"}, "backend.options.segmnt_bytes", "'segment_bytes'"),
    ],
)
def test_bad_options_name_the_field_and_where_it_came_from(
    env: dict[str, str], path: str, says: str
) -> None:
    base = {} if "MASTER" in "".join(env) or not env else {ENV + "MASTER": "h:1"}
    with pytest.raises(ConfigError) as caught:
        loaded(**base, **env)
    issues = {issue.path: issue for issue in caught.value.issues}
    assert path in issues, caught.value
    assert says in issues[path].message.lower() or says in issues[path].message
    if env:
        assert issues[path].origin.startswith("env " + ENV)


def test_building_without_mooncake_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mooncake.store", None)  # import fails as if absent
    config = loaded(**{ENV + "MASTER": "127.0.0.1:1"})
    with pytest.raises(PluginError) as caught:
        build_pipeline(config)
    message = str(caught.value)
    assert "mooncake-transfer-engine-non-cuda==0.3.13.post1" in message
    assert "libibverbs1" in message and ".ci/install-mooncake.sh" in message


def test_the_plugin_readmes_profile_loads_as_it_says(tmp_path: Path) -> None:
    readme = (ROOT / "plugins" / "kvcr-policy-mooncake" / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Across hosts with Mooncake Store", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```toml\n(.*?)```", section, re.S)
    assert block is not None, "the section has no profile"
    profile = tmp_path / "mooncake.toml"
    profile.write_text(block.group(1), encoding="utf-8")
    config = load_config(profile, environ={}, dotenv=False).config
    assert config.backend.name == "mooncake"
    assert config.backend.options["master"] == "10.0.0.5:50051"
    assert config.backend.options["protocol"] == "rdma"
    assert config.batching.window_batches == 4
