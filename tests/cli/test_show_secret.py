"""``show`` names where the peer secret comes from (never the secret): the default file when it
exists, a ``security.secret_file``, the environment, or none yet (``serve`` creates the file)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.support.commands import run_main

pytestmark = pytest.mark.usefixtures("clean_env")
SECRET = "s3cret-" + "x" * 30


def _show(capsys: pytest.CaptureFixture[str]) -> dict[str, str]:
    code, out, err = run_main(capsys, "show", "--format", "json")
    assert code == 0, err
    assert SECRET not in out
    secret: dict[str, str] = json.loads(out)["secret"]
    code, table, err = run_main(capsys, "show")
    assert code == 0 and SECRET not in table, err
    return secret


def _private(path: Path) -> Path:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.write_text(SECRET + "\n", encoding="utf-8")
    os.chmod(path, 0o600)
    return path


def test_show_names_the_secrets_source(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    default = tmp_path / "config" / "kvcr-policy" / "peer.secret"
    assert _show(capsys) == {"value": "null", "from": f"none yet: serve creates {default} "
                             "(the default file)"}  # fmt: skip
    _private(default)
    assert _show(capsys) == {"value": "<hidden>", "from": f"file {default} (the default file)"}
    mine = _private(tmp_path / "keys" / "mine")
    monkeypatch.setenv("KVCR_POLICY_SECURITY__SECRET_FILE", str(mine))
    assert (
        _show(capsys)["from"]
        == f"file {mine} (security.secret_file, env KVCR_POLICY_SECURITY__SECRET_FILE)"
    )
    monkeypatch.delenv("KVCR_POLICY_SECURITY__SECRET_FILE")
    monkeypatch.setenv("KVCR_POLICY_SECURITY__SECRET", SECRET)
    assert _show(capsys) == {"value": "<hidden>", "from": "env KVCR_POLICY_SECURITY__SECRET"}
