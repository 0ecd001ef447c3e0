"""Tests for kvcr_policy.config.loading: precedence pair by pair, origins, errors, round trips.

Precedence, highest first: override > env > .env > profile > default. As in pydantic-settings'
own tests, each pair of sources gets one short test.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcr_policy.config.loading import PRECEDENCE, LoadedConfig, load_config
from kvcr_policy.config.schema import PolicyConfig
from kvcr_policy.config.selection import bundled_profiles
from kvcr_policy.config.sources import env_name, known_leaves
from kvcr_policy.registry import Registry
from tests.strategies import config_leaves, env_text
from tests.support.config import load_issues

pytestmark = pytest.mark.usefixtures("clean_env")

LEAF = "batching.read_batch_pages"
ENV = "KVCR_POLICY_BATCHING__READ_BATCH_PAGES"
ProfileWriter = Callable[..., Path]


@pytest.fixture
def profile(write_profile: ProfileWriter) -> Path:
    return write_profile("[batching]\nread_batch_pages = 32\n")


@pytest.fixture
def dotenv(tmp_path: Path) -> Path:
    path = tmp_path / "site.env"
    path.write_text(f"{ENV}=48\n", encoding="utf-8")
    return path


def _value_and_origin(loaded: LoadedConfig) -> tuple[int, str]:
    return loaded.config.batching.read_batch_pages, loaded.origin(LEAF)


# --- precedence, one pair per test ---


def test_precedence_is_declared_once_in_readme_order() -> None:
    assert PRECEDENCE == ("override", "env", "dotenv", "secrets", "profile", "default")


def test_profile_beats_default(profile: Path) -> None:
    loaded = load_config(profile, environ={})
    assert _value_and_origin(loaded) == (32, f"profile {profile} [batching]")


def test_env_beats_default() -> None:
    loaded = load_config(environ={ENV: "64"})
    assert _value_and_origin(loaded) == (64, f"env {ENV}")


def test_override_beats_default() -> None:
    loaded = load_config(environ={}, overrides={LEAF: 16})
    assert _value_and_origin(loaded) == (16, "override")


def test_env_beats_profile(profile: Path) -> None:
    loaded = load_config(profile, environ={ENV: "64"})
    assert _value_and_origin(loaded) == (64, f"env {ENV}")


def test_override_beats_profile(profile: Path) -> None:
    loaded = load_config(profile, environ={}, overrides={LEAF: 16})
    assert _value_and_origin(loaded) == (16, "override")


def test_override_beats_env() -> None:
    loaded = load_config(environ={ENV: "64"}, overrides={LEAF: 16})
    assert _value_and_origin(loaded) == (16, "override")


def test_dotenv_beats_default(dotenv: Path) -> None:
    loaded = load_config(environ={}, dotenv=dotenv)
    assert _value_and_origin(loaded) == (48, f"dotenv {dotenv} {ENV}")


def test_dotenv_beats_profile(profile: Path, dotenv: Path) -> None:
    loaded = load_config(profile, environ={}, dotenv=dotenv)
    assert _value_and_origin(loaded) == (48, f"dotenv {dotenv} {ENV}")


def test_env_beats_dotenv(dotenv: Path) -> None:
    loaded = load_config(environ={ENV: "64"}, dotenv=dotenv)
    assert _value_and_origin(loaded) == (64, f"env {ENV}")


def test_override_beats_dotenv(dotenv: Path) -> None:
    loaded = load_config(environ={}, overrides={LEAF: 16}, dotenv=dotenv)
    assert _value_and_origin(loaded) == (16, "override")


def test_no_source_leaves_the_default() -> None:
    assert _value_and_origin(load_config(environ={})) == (128, "default")


# --- merging and origins ---


def test_profile_setting_one_key_keeps_the_other_defaults(profile: Path) -> None:
    loaded = load_config(profile, environ={})
    assert loaded.config.batching.query_batch_keys == 128
    assert loaded.config.batching.strategy == "fixed"
    assert loaded.origin("batching.query_batch_keys") == "default"
    assert loaded.changed() == {LEAF: (32, f"profile {profile} [batching]")}


def test_sources_merge_leaf_by_leaf(profile: Path) -> None:
    loaded = load_config(
        profile,
        environ={"KVCR_POLICY_BATCHING__QUERY_BATCH_KEYS": "8"},
        overrides={"batching": {"window_batches": 2}},
    )
    batching = loaded.config.batching
    assert (batching.read_batch_pages, batching.query_batch_keys) == (32, 8)
    assert batching.window_batches == 2
    assert loaded.origin("batching.window_batches") == "override"


ORIGIN = re.compile(r"default|override|env KVCR_POLICY_[A-Z_]+|profile .+\.toml \[[a-z_.]+\]")


def test_every_leaf_has_an_origin(profile: Path) -> None:
    loaded = load_config(profile, environ={"KVCR_POLICY_FALLBACK__MAX_RETRIES": "2"})
    fields = {p for p in known_leaves() if not p.endswith(".options")}
    option_leaves = {"transport.options.min_parallel_bytes"}  # the cpu transport's options
    assert set(loaded.origins) == fields | option_leaves
    assert all(ORIGIN.fullmatch(origin) for origin in loaded.origins.values()), loaded.origins
    assert loaded.origin("fallback.max_retries") == "env KVCR_POLICY_FALLBACK__MAX_RETRIES"


def test_profile_env_selects_a_bundled_profile_by_name() -> None:
    loaded = load_config(environ={"KVCR_POLICY_PROFILE": "throughput"})
    path = bundled_profiles()["throughput"]
    assert loaded.profile == str(path)
    assert loaded.config.batching.read_batch_pages == 256
    assert loaded.origin(LEAF) == f"profile {path} [batching]"


def test_profile_env_selects_a_profile_by_path(profile: Path) -> None:
    loaded = load_config(environ={"KVCR_POLICY_PROFILE": str(profile)})
    assert loaded.profile == str(profile.resolve())
    assert loaded.config.batching.read_batch_pages == 32


def test_profile_argument_beats_the_profile_env(profile: Path) -> None:
    loaded = load_config("throughput", environ={"KVCR_POLICY_PROFILE": str(profile)})
    assert loaded.config.batching.read_batch_pages == 256


def test_default_profile_equals_schema_defaults() -> None:
    assert load_config("default", environ={}).config == load_config(environ={}).config
    assert load_config(environ={}).config.batching == PolicyConfig().batching


@pytest.mark.parametrize("name", sorted(bundled_profiles()))
def test_every_bundled_profile_loads(name: str) -> None:
    loaded = load_config(name, environ={})
    assert loaded.profile == str(bundled_profiles()[name])


# --- errors ---


def test_unknown_key_in_a_file_names_key_file_table_and_nearest(
    write_profile: ProfileWriter,
) -> None:
    path = write_profile("[batching]\nread_batch_page = 64\n")
    (issue,) = load_issues(profile=path, environ={})
    assert issue.startswith(f"batching.read_batch_page (from profile {path} [batching])")
    assert "did you mean 'batching.read_batch_pages'?" in issue


def test_unknown_variable_names_the_nearest() -> None:
    (issue,) = load_issues(environ={"KVCR_POLICY_BATCHING__READ_BATCH_PAGE": "64"})
    assert "(from env KVCR_POLICY_BATCHING__READ_BATCH_PAGE)" in issue
    assert "did you mean KVCR_POLICY_BATCHING__READ_BATCH_PAGES" in issue
    assert "batching.read_batch_pages" in issue


def test_bad_value_names_path_origin_expected_and_got() -> None:
    (issue,) = load_issues(environ={ENV: "many"})
    assert issue.startswith(f"{LEAF} (from env {ENV}): expected: ")
    assert "valid integer" in issue
    assert "got 'many'" in issue


def test_window_below_batch_names_both_fields(write_profile: ProfileWriter) -> None:
    path = write_profile("[batching]\nwindow_pages = 8\n")
    (issue,) = load_issues(profile=path, environ={ENV: "16"})
    assert "batching.window_pages (8)" in issue
    assert "batching.read_batch_pages (16)" in issue
    assert f"profile {path} [batching]" in issue
    assert f"env {ENV}" in issue


def test_numa_policy_without_nodes_names_both_fields() -> None:
    (issue,) = load_issues(environ={}, overrides={"placement.numa_policy": "bind"})
    assert "placement.numa_policy 'bind' needs placement.numa_nodes" in issue
    assert "(from override)" in issue


def test_one_load_reports_every_problem(write_profile: ProfileWriter) -> None:
    path = write_profile("[batching]\nread_batch_page = 64\n[placement]\nnuma_policy = 'bind'\n")
    issues = load_issues(
        profile=path,
        environ={"KVCR_POLICY_FALLBACK__MAX_RETRIES": "-1", "KVCR_POLICY_TRANSPORT__THREAD": "2"},
        overrides={"transport.op_timeout_s": 0},
    )
    assert len(issues) == 5, issues
    joined = "\n".join(issues)
    for needle in (
        "batching.read_batch_page (from profile",
        "placement (from profile",
        "fallback.max_retries (from env KVCR_POLICY_FALLBACK__MAX_RETRIES)",
        "KVCR_POLICY_TRANSPORT__THREADS",
        "transport.op_timeout_s (from override)",
    ):
        assert needle in joined


def test_unknown_strategy_lists_registered_names_and_origin(
    write_profile: ProfileWriter,
) -> None:
    path = write_profile("[batching]\nstrategy = 'fixd'\n[fallback]\nstrategy = 'never'\n")
    issues = load_issues(profile=path, environ={})
    assert len(issues) == 2
    assert issues[0].startswith(f"batching.strategy (from profile {path} [batching])")
    assert "did you mean 'fixed'?" in issues[0]
    assert "registered: " in issues[0]
    assert "registered: miss, sparse" in issues[1]


def test_unknown_strategy_option_names_the_nearest() -> None:
    (issue,) = load_issues(environ={"KVCR_POLICY_TRANSPORT__OPTIONS__MIN_PARALEL_BYTES": "1"})
    assert "transport.options.min_paralel_bytes (from env " in issue
    assert "did you mean 'min_parallel_bytes'?" in issue


def test_bad_toml_is_reported(write_profile: ProfileWriter) -> None:
    path = write_profile("[batching]\nread_batch_pages = \n")
    (issue,) = load_issues(profile=path, environ={})
    assert f"(from {path}): not valid TOML" in issue


def test_missing_profile_lists_bundled_ones() -> None:
    (issue,) = load_issues(environ={"KVCR_POLICY_PROFILE": "throughputt"})
    assert "(from env KVCR_POLICY_PROFILE)" in issue
    assert "did you mean 'throughput'?" in issue
    assert "bundled: " + ", ".join(bundled_profiles()) in issue


# --- round trips ---


@settings(max_examples=60, deadline=None)
@given(data=st.data(), leaves=config_leaves())
def test_config_round_trips_through_env(
    registry: Registry, data: st.DataObject, leaves: dict[str, object]
) -> None:
    environ = {env_name(path): data.draw(env_text(path, value)) for path, value in leaves.items()}
    from_env = load_config(environ=environ, registry=registry)
    from_overrides = load_config(environ={}, overrides=leaves, registry=registry)
    assert from_env.config == from_overrides.config
    for path in leaves:
        assert from_env.origin(path) == f"env {env_name(path)}"
        assert from_overrides.origin(path) == "override"
