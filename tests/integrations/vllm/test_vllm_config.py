"""The connector's and the tier's options: checked as vLLM hands them over, with origins that
name vLLM's flag, and the tier chosen for the engine's processes. No vLLM needed."""

from __future__ import annotations

import pytest

from kvcr_policy.errors import ConfigError
from kvcr_policy.integrations.vllm.config import (
    CONNECTOR_ORIGIN,
    TIER_ORIGIN,
    connector_config_for,
    parse_options,
)
from kvcr_policy.integrations.vllm.startup import load


def test_a_misspelt_key_is_refused_with_the_nearest_name() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_options({"profil": "throughput"})
    text = str(caught.value)
    assert "profil" in text and "did you mean 'profile'" in text and CONNECTOR_ORIGIN in text


def test_a_profile_that_is_not_a_name_is_refused() -> None:
    with pytest.raises(ConfigError, match="bundled profile name"):
        parse_options({"profile": 3})


def test_the_tier_tolerates_vllms_own_keys_only_where_asked() -> None:
    options = parse_options(
        {"locality": "LOCAL"}, origin=TIER_ORIGIN, tolerated=frozenset({"locality"})
    )
    assert options.profile is None
    with pytest.raises(ConfigError, match="unknown key"):
        parse_options({"locality": "LOCAL"}, origin=TIER_ORIGIN)


def test_a_bad_override_names_its_key_in_vllms_flag() -> None:
    options = parse_options({"overrides": {"placement.capacity_bytes": "lots"}})
    with pytest.raises(ConfigError) as caught:
        load(options)
    assert f"{CONNECTOR_ORIGIN} ['overrides']['placement.capacity_bytes']" in str(caught.value)


def test_overrides_reach_the_configuration_with_their_origin() -> None:
    options = parse_options(
        {"profile": "throughput", "overrides": {"batching.read_batch_pages": 64}}
    )
    loaded = load(options)
    assert loaded.config.batching.read_batch_pages == 64
    assert "['overrides']['batching.read_batch_pages']" in loaded.origin(
        "batching.read_batch_pages"
    )


def test_one_process_keeps_the_private_tier() -> None:
    assert load(parse_options({})).config.backend.name in ("auto", "dram")


def test_separate_processes_get_the_host_tier_and_say_why() -> None:
    loaded = load(parse_options({}), shared_by="vLLM executor 'mp', tp 2, pp 1")
    assert loaded.config.backend.name == "host"
    assert "executor 'mp'" in loaded.origin("backend.name")


def test_a_private_tier_named_for_separate_processes_is_refused_with_the_fix() -> None:
    options = parse_options({"overrides": {"backend.name": "dram"}})
    with pytest.raises(ConfigError) as caught:
        load(options, shared_by="vLLM executor 'mp', tp 1, pp 1")
    assert "backend.name = 'host'" in str(caught.value)


def test_connector_config_for_is_what_vllm_loads() -> None:
    config = connector_config_for("throughput", {"placement.capacity_bytes": "1GiB"})
    assert config["kv_connector"] == "KVCRPolicyConnector"
    assert config["kv_connector_module_path"] == "kvcr_policy.integrations.vllm"
    assert config["kv_connector_extra_config"]["profile"] == "throughput"
    with pytest.raises(ConfigError, match="overrides"):
        connector_config_for("throughput", "not an object")
