"""Profiles that extend a base (``[profile] base``): values, origins, chains and errors."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from kvcr_policy import load_config
from kvcr_policy.config.profiles import MAX_BASES, read_meta
from kvcr_policy.config.selection import bundled_profiles
from kvcr_policy.errors import ConfigError

pytestmark = pytest.mark.usefixtures("clean_env")
Write = Callable[..., Path]


def test_the_file_wins_over_its_base_and_each_value_keeps_its_file(
    write_profile: Write,
) -> None:
    path = write_profile(
        """
        [profile]
        base = "throughput"

        [batching]
        read_batch_pages = 512
        """,
        "site.toml",
    )
    loaded = load_config(profile=path, dotenv=False)
    base = str(bundled_profiles()["throughput"])
    assert loaded.config.batching.read_batch_pages == 512
    assert loaded.config.batching.window_batches == 4  # from throughput
    assert loaded.origin("batching.read_batch_pages") == f"profile {path} [batching]"
    assert loaded.origin("batching.window_batches") == f"profile {base} [batching]"
    assert loaded.origin("batching.query_batch_keys").startswith(f"profile {base}")
    assert loaded.bases == (base,)


def test_a_base_path_is_relative_to_the_file_and_chains_are_followed(
    write_profile: Write, tmp_path: Path
) -> None:
    (tmp_path / "sub").mkdir()
    write_profile('[profile]\nbase = "default"\n[transport]\nthreads = 3\n', "middle.toml")
    top = write_profile('[profile]\nbase = "../middle.toml"\n', "sub/top.toml")
    loaded = load_config(profile=top, dotenv=False)
    assert loaded.config.transport.threads == 3
    assert loaded.origin("transport.threads") == f"profile {tmp_path / 'middle.toml'} [transport]"
    assert loaded.config.batching.read_batch_pages == 128  # default.toml
    assert len(loaded.bases) == 2


def test_environment_and_overrides_still_win_over_the_file(write_profile: Write) -> None:
    path = write_profile('[profile]\nbase = "throughput"\n[batching]\nread_batch_pages = 512\n')
    env = {"KVCR_POLICY_BATCHING__READ_BATCH_PAGES": "64"}
    loaded = load_config(profile=path, environ=env, dotenv=False)
    assert loaded.config.batching.read_batch_pages == 64
    over = load_config(profile=path, overrides={"batching.read_batch_pages": 32}, dotenv=False)
    assert over.config.batching.read_batch_pages == 32


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[profile]\nbse = "throughput"\n', "unknown key; did you mean 'base'?"),
        ('[profile]\nbase = ""\n', "expected a bundled profile name or a path"),
        ('[profile]\nbase = "throughputt"\n', "did you mean 'throughput'?"),
        ("profile = 3\n", "expected a table"),
        ('[profile]\ntune = "x"\n', "expected a table ([profile.tune])"),
    ],
)
def test_a_bad_profile_table_is_an_error_naming_the_file(
    write_profile: Write, text: str, message: str
) -> None:
    path = write_profile(text)
    with pytest.raises(ConfigError) as caught:
        load_config(profile=path, dotenv=False)
    assert message in str(caught.value)
    assert str(path) in str(caught.value)


def test_a_cycle_is_refused(write_profile: Write) -> None:
    write_profile('[profile]\nbase = "b.toml"\n', "a.toml")
    b = write_profile('[profile]\nbase = "a.toml"\n', "b.toml")
    with pytest.raises(ConfigError, match="extend each other in a cycle"):
        load_config(profile=b, dotenv=False)


def test_a_chain_too_long_is_refused(write_profile: Write) -> None:
    for i in range(MAX_BASES + 1):
        write_profile(f'[profile]\nbase = "p{i + 1}.toml"\n', f"p{i}.toml")
    top = write_profile("", f"p{MAX_BASES + 1}.toml").with_name("p0.toml")
    with pytest.raises(ConfigError, match=f"more than {MAX_BASES} profiles"):
        load_config(profile=top, dotenv=False)


def test_read_meta_returns_the_tune_record(write_profile: Write) -> None:
    path = write_profile('[profile]\nbase = "default"\n[profile.tune]\ngeometry = "small"\n')
    meta, issues = read_meta(path)
    assert (meta.base, dict(meta.tune), issues) == ("default", {"geometry": "small"}, [])


def test_validate_accepts_a_profile_that_extends_a_base(write_profile: Write) -> None:
    path = write_profile('[profile]\nbase = "throughput"\n[transport]\nthreads = 1\n')
    done = subprocess.run(
        [sys.executable, "-m", "kvcr_policy", "validate", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
