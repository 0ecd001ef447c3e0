"""``kvcr-policy show`` in an 80-column terminal: keys whole, origins short, sections grouped.

The command runs in a subprocess with ``COLUMNS=80``, exactly what a user of a narrow terminal
gets; the helpers are checked on their own paths (bundled, cwd, home, long).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kvcr_policy.config.loading import load_config
from kvcr_policy.config.selection import bundled_profiles
from kvcr_policy.config.table import config_rows, short_origin, short_path
from tests.support.paths import child_env

pytestmark = pytest.mark.usefixtures("clean_env")

ENV = "KVCR_POLICY_BATCHING__READ_BATCH_PAGES"


def _show(*argv: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "kvcr_policy", "show", *argv],
        env=child_env(drop=("KVCR_POLICY_",), **{"COLUMNS": "80", **(env or {})}),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        cwd=cwd,
    )
    return done.stdout


def test_every_key_is_whole_in_80_columns(tmp_path: Path) -> None:
    deep = tmp_path / "a-rather-long-folder-name" / "and-another-one" / "site"
    deep.mkdir(parents=True)
    profile = deep / "prefill-node.toml"
    profile.write_text("[transport]\noptions = { min_parallel_bytes = 8388608 }\n")
    out = _show("--profile", str(profile), "--set", "batching.window_bytes=16GiB",
                env={ENV: "64"}, cwd=deep)  # fmt: skip
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 80
    loaded = load_config(profile, environ={ENV: "64"}, overrides={"batching.window_bytes": "16GiB"})
    for row in config_rows(loaded):
        assert any(line.startswith(f"  {row.key} ") for line in lines), row.key
    for section in ("batching", "coalescing", "placement", "transport", "observability"):
        assert f"[{section}]" in out
    assert "profile: ./prefill-node.toml" in out
    # Wrapped, not cut: the origin's words follow one another in the origin column.
    assert "profile ./prefill-node.toml" in out and "[transport.options]" in out
    assert "16GiB" in out and "8MiB" in out  # byte sizes as a profile writes them
    row = next(line for line in lines if line.startswith("  read_batch_pages "))
    assert row.split()[1:] == ["64", "env"]
    assert "KVCR_POLICY" not in out.replace("KVCR_POLICY_<SECTION>__<KEY>", "")


def test_a_bundled_profile_is_named_by_its_name() -> None:
    out = _show("--profile", "throughput")
    assert "profile: throughput" in out
    assert "throughput [coalescing]" in out
    assert str(bundled_profiles()["throughput"]) not in out


def test_env_names_on_request() -> None:
    out = _show("--env", env={"COLUMNS": "200"})
    assert ENV in out
    assert "KVCR_POLICY_PLUGINS" in out  # the alias of plugins.allow
    assert ENV not in _show(env={"COLUMNS": "200"})


def test_short_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert short_path(bundled_profiles()["default"]) == "default"
    assert short_path(tmp_path / "x" / "p.toml", cwd=tmp_path) == "./x/p.toml"
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert short_path(tmp_path / "home" / "kvcr" / "p.toml", cwd=Path("/nowhere")) == (
        "~/kvcr/p.toml"
    )
    long = Path("/srv") / ("x" * 50) / "kvcr" / "site.toml"
    assert short_path(long, cwd=Path("/nowhere")) == "…/kvcr/site.toml"
    assert short_path("/etc/kvcr/site.toml", cwd=Path("/nowhere")) == "/etc/kvcr/site.toml"


def test_short_origins(tmp_path: Path) -> None:
    throughput = bundled_profiles()["throughput"]
    assert short_origin(f"profile {throughput} [batching]") == "throughput [batching]"
    assert short_origin(f"profile {tmp_path}/a.toml [x]", cwd=tmp_path) == "profile ./a.toml [x]"
    assert short_origin(f"env {ENV}", env=ENV) == "env"
    assert short_origin("env KVCR_POLICY_PLUGINS", env="KVCR_POLICY_PLUGINS__ALLOW") == (
        "env KVCR_POLICY_PLUGINS"
    )
    assert short_origin(f"dotenv {tmp_path}/.env {ENV}", cwd=tmp_path, env=ENV) == "dotenv ./.env"
    assert short_origin("override") == "override"
    assert short_origin("default") == "default"
