"""Tests for kvcr_policy.cli: commands, exit codes, and messages on the right stream.

Most tests call :func:`kvcr_policy.cli.main` in-process (fast, and it is the console entry
point itself); a few run ``python -m kvcr_policy`` in a subprocess to see exactly what a user
sees: the real exit status, stderr, and no traceback.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from kvcr_policy.config.loading import load_config
from kvcr_policy.config.order import FIELD_ORDER_FILE, schemas_dir
from kvcr_policy.config.selection import bundled_profiles

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 only
    import tomli as tomllib

pytestmark = pytest.mark.usefixtures("clean_env")

ENV = "KVCR_POLICY_BATCHING__READ_BATCH_PAGES"
Run = Callable[..., tuple[int, str, str]]


def _subprocess(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.upper().startswith("KVCR_POLICY_")}
    return subprocess.run(
        [sys.executable, "-m", "kvcr_policy", *argv],
        env={**clean, "COLUMNS": "400", **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


# --- through a subprocess: what a user sees ---


def test_module_help_lists_the_commands() -> None:
    done = _subprocess("--help")
    assert done.returncode == 0, done.stderr
    for command in ("show", "validate", "profiles", "schema", "plugins"):
        assert command in done.stdout


def test_show_json_quotes_the_env_origin() -> None:
    done = _subprocess("show", "--format", "json", env={ENV: "64"})
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    assert shown["config"]["batching"]["read_batch_pages"] == 64
    assert shown["origins"]["batching.read_batch_pages"] == f"env {ENV}"


def test_misspelled_variable_exits_2_with_one_message() -> None:
    done = _subprocess("show", env={"KVCR_POLICY_BATCHING__READ_BATCH_PAGE": "64"})
    assert done.returncode == 2
    assert done.stdout == ""
    assert "read_batch_pages" in done.stderr
    assert "KVCR_POLICY_BATCHING__READ_BATCH_PAGE" in done.stderr
    assert "Traceback" not in done.stderr


def test_show_table_keeps_table_names_in_origins() -> None:
    # Origins quote TOML tables ("[batching]"); rich must not eat them as markup.
    done = _subprocess("show", "--profile", "throughput")
    assert done.returncode == 0, done.stderr
    assert "throughput [batching]" in done.stdout  # a bundled profile by its name


# --- in-process ---


def test_show_set_overrides(cli: Run) -> None:
    overrides = ("--set", "batching.read_batch_pages=16", "-s", "fallback.max_retries=3")
    code, out, _ = cli("show", *overrides, "--format", "json")
    assert code == 0
    shown = json.loads(out)
    assert shown["config"]["batching"]["read_batch_pages"] == 16
    assert shown["config"]["fallback"]["max_retries"] == 3
    assert shown["origins"]["batching.read_batch_pages"] == "override"


def test_bad_set_is_a_usage_error(cli: Run) -> None:
    code, out, err = cli("show", "--set", "batching.read_batch_pages")
    assert code == 2
    assert "expected KEY=VALUE" in err
    assert out == ""


def test_unknown_command_is_a_usage_error(cli: Run) -> None:
    code, _, err = cli("shwo")
    assert code == 2
    assert "No such command" in err


def test_show_toml_parses_and_loads_back(
    cli: Run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV, "64")
    code, out, _ = cli("show", "--profile", "throughput", "--format", "toml")
    assert code == 0
    parsed = tomllib.loads(out)
    assert parsed["batching"]["read_batch_pages"] == 64
    assert "window_pages" not in parsed["batching"]  # unset: TOML has no null
    assert f"read_batch_pages = 64  # env {ENV}" in out
    shown = tmp_path / "shown.toml"
    shown.write_text(out, encoding="utf-8")
    again = load_config(shown, environ={})
    assert again.config == load_config("throughput", environ={ENV: "64"}).config


def test_validate_good_profiles_exits_0(cli: Run) -> None:
    code, out, err = cli("validate", *bundled_profiles())
    assert code == 0, err
    for name in bundled_profiles():
        assert f"✓ {name}" in out


def test_validate_reports_every_error_and_exits_2(
    cli: Run, write_profile: Callable[..., Path]
) -> None:
    bad = write_profile("[batching]\nread_batch_page = 1\nwindow_pages = 2\n", name="bad.toml")
    worse = write_profile("[placement]\nnuma_policy = 'bind'\n", name="worse.toml")
    code, out, err = cli("validate", "default", str(bad), str(worse))
    assert code == 2
    assert "✓ default" in out
    assert "2 problems" in err
    assert f"batching.read_batch_page (from profile {bad} [batching])" in err
    assert "batching.window_pages (2) must be at least batching.read_batch_pages (128)" in err
    assert f"placement (from profile {worse} [placement])" in err


def test_profiles_json_lists_bundled_profiles(cli: Run) -> None:
    code, out, _ = cli("profiles", "--format", "json")
    assert code == 0
    rows = json.loads(out)
    assert [row["name"] for row in rows] == list(bundled_profiles())
    assert all(row["purpose"] for row in rows)
    assert rows[0]["purpose"].startswith("upstream behaviour")


def test_plugins_json_lists_builtins_with_provider(cli: Run) -> None:
    code, out, _ = cli("plugins", "--format", "json")
    assert code == 0
    listed = json.loads(out)
    fixed = {s["name"]: s for s in listed["strategies"]["batching"]}["fixed"]
    assert (fixed["plugin"], fixed["distribution"]) == ("builtin.batching", "kvcr-policy")
    assert {s["name"] for s in listed["strategies"]["transport"]} >= {"cpu", "memory"}


def test_schema_check_passes_on_the_committed_folder(cli: Run) -> None:
    code, out, _ = cli("schema", "--check")
    assert code == 0
    assert "matches the code" in out


def test_schema_check_fails_naming_the_field(cli: Run, tmp_path: Path) -> None:
    folder = tmp_path / "schemas"
    shutil.copytree(schemas_dir(), folder)
    pinned = json.loads((folder / FIELD_ORDER_FILE).read_text(encoding="utf-8"))
    fields = pinned["TransportSection"]
    fields[0], fields[1] = fields[1], fields[0]
    (folder / FIELD_ORDER_FILE).write_text(json.dumps(pinned), encoding="utf-8")
    code, _, err = cli("schema", "--check", "--dir", str(folder))
    assert code == 1
    assert "TransportSection.threads: pinned at position 0" in err


def test_schema_write_makes_a_fresh_folder(cli: Run, tmp_path: Path) -> None:
    folder = tmp_path / "fresh"
    code, _, _ = cli("schema", "--write", "--dir", str(folder))
    assert code == 0
    assert cli("schema", "--check", "--dir", str(folder))[0] == 0


def test_schema_prints_the_json_schema(cli: Run) -> None:
    code, out, _ = cli("schema")
    assert code == 0
    assert json.loads(out)["x-env-prefix"] == "KVCR_POLICY_"


def test_validate_json_reports_each_profile_and_every_problem(
    cli: Run, write_profile: Callable[..., Path]
) -> None:
    bad = write_profile(
        """
        [batching]
        read_batch_pagez = 64
        """
    )
    status, out, err = cli("validate", "throughput", str(bad), "--format", "json")
    assert status == 2, err
    report = json.loads(out)
    assert report["ok"] is False
    good, wrong = report["profiles"]
    assert (good["profile"], good["ok"], good["issues"]) == ("throughput", True, [])
    assert wrong["profile"] == str(bad) and wrong["ok"] is False
    assert [issue["path"] for issue in wrong["issues"]] == ["batching.read_batch_pagez"]
    assert "read_batch_pages" in wrong["issues"][0]["message"]  # the suggestion


def test_validate_json_all_good_exits_0(cli: Run) -> None:
    status, out, err = cli("validate", "default", "--format", "json")
    assert status == 0, err
    assert json.loads(out) == {
        "ok": True,
        "profiles": [{"profile": "default", "ok": True, "error": None, "issues": []}],
    }


@pytest.mark.parametrize("command", ["show", "plan", "bench", "tune", "serve", "audit"])
def test_every_command_reads_its_profile_from_the_environment(
    cli: Run, monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    # The same fallback everywhere: --profile, else KVCR_POLICY_PROFILE. A name that does not
    # exist proves the variable was read: each command refuses it naming the variable.
    monkeypatch.setenv("KVCR_POLICY_PROFILE", "no-such-profile")
    extra = ["--tokens", "64"] if command == "plan" else []
    status, _out, err = cli(command, *extra)
    assert status == 2
    assert "no-such-profile" in err and "env KVCR_POLICY_PROFILE" in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize("option", ["--profile", "--from"])
def test_tune_profile_and_its_alias_from_name_the_start(cli: Run, option: str) -> None:
    status, _out, err = cli("tune", option, "no-such-profile", "--budget", "1")
    assert status == 2
    assert "no bundled profile or file named 'no-such-profile'" in err, err


def test_schema_reports_as_json(cli: Run, tmp_path: Path) -> None:
    folder = tmp_path / "fresh"
    code, out, _ = cli("schema", "--write", "--dir", str(folder), "--format", "json")
    assert code == 0
    wrote = json.loads(out)["wrote"]
    assert wrote and all(Path(path).parent == folder for path in wrote)
    code, out, _ = cli("schema", "--check", "--dir", str(folder), "--format", "json")
    assert (code, json.loads(out)) == (0, {"ok": True, "problems": []})
    pinned = json.loads((folder / FIELD_ORDER_FILE).read_text(encoding="utf-8"))
    pinned["TransportSection"].reverse()
    (folder / FIELD_ORDER_FILE).write_text(json.dumps(pinned), encoding="utf-8")
    code, out, _ = cli("schema", "--check", "--dir", str(folder), "--format", "json")
    report = json.loads(out)
    assert code == 1 and report["ok"] is False
    assert any("TransportSection" in problem for problem in report["problems"])


def test_every_reporting_command_takes_format_json(cli: Run) -> None:
    """Every command prints a report, so each takes ``--format json`` (serve and
    sglang-config report in JSON only and take it too); each command's own tests parse it."""
    import typer.main

    from kvcr_policy.cli import app

    names = sorted(typer.main.get_command(app).commands)  # type: ignore[attr-defined]
    assert len(names) >= 11
    for name in names:
        code, out, _ = cli(name, "--help")
        assert code == 0, name
        line = next((line for line in out.splitlines() if "--format" in line), "")
        assert "json" in line, f"{name}: {line or 'no --format'}"
