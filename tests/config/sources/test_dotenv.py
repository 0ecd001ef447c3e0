"""Tests for the ``.env`` source of load_config: where it is found, what it may set, its errors.

Precedence pairs with the other sources are in tests/config/test_loading.py; the source alone
is in tests/config/sources/test_sources.py. Each test here runs in its own working directory
(tmp_path), because the default ``.env`` is the one in the working directory.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kvcr_policy.cli import main
from kvcr_policy.config.loading import load_config
from kvcr_policy.config.selection import bundled_profiles
from tests.support.config import load_issues

pytestmark = pytest.mark.usefixtures("clean_env")

ENV = "KVCR_POLICY_BATCHING__READ_BATCH_PAGES"
LEAF = "batching.read_batch_pages"


@pytest.fixture
def cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _write(folder: Path, text: str, name: str = ".env") -> Path:
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


def test_dotenv_in_the_working_directory_is_read_by_default(cwd: Path) -> None:
    path = _write(cwd, f"{ENV}=48\n")
    loaded = load_config(environ={})
    assert loaded.config.batching.read_batch_pages == 48
    assert loaded.origin(LEAF) == f"dotenv {path} {ENV}"
    assert loaded.changed() == {LEAF: (48, f"dotenv {path} {ENV}")}


def test_dotenv_false_reads_none(cwd: Path) -> None:
    _write(cwd, f"{ENV}=48\n")
    assert load_config(environ={}, dotenv=False).origin(LEAF) == "default"


def test_no_dotenv_file_is_no_source(cwd: Path) -> None:
    assert load_config(environ={}).origin(LEAF) == "default"


def test_dotenv_argument_names_another_file(cwd: Path, tmp_path: Path) -> None:
    _write(cwd, f"{ENV}=48\n")
    other = _write(tmp_path, f"{ENV}=24\n", name="site.env")
    loaded = load_config(environ={}, dotenv=other)
    assert loaded.origin(LEAF) == f"dotenv {other} {ENV}"


def test_a_named_dotenv_file_must_exist(cwd: Path) -> None:
    (issue,) = load_issues(environ={}, dotenv="nowhere.env")
    assert issue == (
        f"<dotenv> (from dotenv {cwd / 'nowhere.env'}): "
        "cannot read the .env file: No such file or directory"
    )


def test_dotenv_does_not_change_the_process_environment(cwd: Path) -> None:
    _write(cwd, f"{ENV}=48\nKVCR_TEST_OTHER_APP=1\n")
    load_config(environ={})
    assert ENV not in os.environ
    assert "KVCR_TEST_OTHER_APP" not in os.environ


def test_dotenv_selects_the_profile(cwd: Path) -> None:
    _write(cwd, "KVCR_POLICY_PROFILE=throughput\n")
    loaded = load_config(environ={})
    assert loaded.profile == str(bundled_profiles()["throughput"])


def test_env_profile_beats_the_dotenv_profile(cwd: Path) -> None:
    _write(cwd, "KVCR_POLICY_PROFILE=throughput\n")
    loaded = load_config(environ={"KVCR_POLICY_PROFILE": "default"})
    assert loaded.profile == str(bundled_profiles()["default"])


def test_unknown_dotenv_profile_quotes_the_file(cwd: Path) -> None:
    path = _write(cwd, "KVCR_POLICY_PROFILE=throughputt\n")
    (issue,) = load_issues(environ={})
    assert issue.startswith(f"profile (from dotenv {path} KVCR_POLICY_PROFILE): ")
    assert "did you mean 'throughput'?" in issue


def test_unknown_dotenv_variable_names_the_nearest(cwd: Path) -> None:
    path = _write(cwd, "KVCR_POLICY_BATCHING__READ_BATCH_PAGE=64\n")
    (issue,) = load_issues(environ={})
    assert issue.startswith(
        f"batching.read_batch_page (from dotenv {path} KVCR_POLICY_BATCHING__READ_BATCH_PAGE): "
    )
    assert "did you mean KVCR_POLICY_BATCHING__READ_BATCH_PAGES (batching.read_batch_pages)?" in (
        issue
    )


def test_malformed_dotenv_line_is_reported_with_the_other_problems(cwd: Path) -> None:
    path = _write(cwd, f"{ENV}=many\nKVCR_POLICY_FALLBACK__MAX_RETRIES 2\n")
    issues = load_issues(environ={})
    assert issues == [
        f"<dotenv> (from dotenv {path}): line 2: cannot parse "
        "the line of KVCR_POLICY_FALLBACK__MAX_RETRIES; expected NAME=VALUE "
        "(quote a value that holds spaces, quotes or '#')",
        f"{LEAF} (from dotenv {path} {ENV}): expected: input should be a valid integer, "
        "unable to parse string as an integer; got 'many'",
    ]


def test_dotenv_can_turn_on_hook_tracing(cwd: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write(cwd, "KVCR_POLICY_TRACE_HOOKS=1\n")
    load_config(environ={})
    assert "kvcr_register_strategies [hook]" in capsys.readouterr().err


def test_dotenv_can_block_a_plugin_like_the_environment(cwd: Path) -> None:
    _write(cwd, "KVCR_POLICY_DISABLE_PLUGINS=someone\n")
    loaded = load_config(environ={})
    assert loaded.config.plugins.block == ("someone",)
    assert loaded.origin("plugins.block") == (f"dotenv {cwd / '.env'} KVCR_POLICY_DISABLE_PLUGINS")


def test_show_prints_the_dotenv_origin(cwd: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(cwd, f"{ENV}=48\n")
    main(["show", "--format", "json"])
    shown = json.loads(capsys.readouterr().out)
    assert shown["config"]["batching"]["read_batch_pages"] == 48
    assert shown["origins"][LEAF] == f"dotenv {path} {ENV}"
    main(["show", "--format", "toml"])
    assert f"read_batch_pages = 48  # dotenv {path} {ENV}" in capsys.readouterr().out


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_a_dotenv_of_another_user_configures_nothing(
    cwd: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The red team's case (2026-12-b, B6): a shared folder's .env, owned by uid 65534 with
    mode 0666, set the secret a process then used."""
    path = _write(cwd, "KVCR_POLICY_SECURITY__SECRET=attacker-knows-this-secret\n")
    path.chmod(0o666)
    os.chown(path, 65534, 65534)
    with pytest.raises(SystemExit) as stop:
        main(["show"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "belongs to another user (uid 65534)" in err and "attacker-knows" not in err


@pytest.mark.parametrize(
    ("line", "mode", "says"),
    [
        ("KVCR_POLICY_SECURITY__INSECURE=true", 0o644, "sets security values and can be read"),
        ("KVCR_POLICY_TRANSPORT__OPTIONS__PEER=10.0.0.9:7480", 0o664, "can be written by group"),
        ("KVCR_POLICY_SECURITY__SECRET=a-secret-long-enough", 0o600, None),
        (f"{ENV}=64", 0o644, None),
    ],
)
def test_a_dotenv_that_sets_security_values_is_held_to_the_secret_file_rules(
    cwd: Path, line: str, mode: int, says: str | None
) -> None:
    path = _write(cwd, line + "\n")
    path.chmod(mode)
    if says is None:
        load_config(environ={})
        return
    (issue,) = load_issues(environ={})
    assert f"dotenv {path}" in issue and says in issue
