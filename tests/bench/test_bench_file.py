"""``kvcr-policy bench --backend file``: both profiles on slot files in the folder given, every
byte verified, the limit one direct sequential read measured in the same run; ``--peer
hicache-file`` runs SGLang's HiCacheFile in the same folder; every folder is removed after."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.commands import run_main

pytestmark = pytest.mark.usefixtures("clean_env")
Run = Callable[..., tuple[int, str, str]]
SMALL = ["--geometry", "small", "--layout", "page_first", "--tokens", "512", "--repeat", "1"]


@pytest.fixture
def bench(capsys: pytest.CaptureFixture[str]) -> Run:
    return lambda *argv: run_main(capsys, "bench", *argv)


def _json(bench: Run, *argv: str) -> dict[str, Any]:
    code, out, err = bench(*argv, "--format", "json")
    assert code == 0, err
    return dict(json.loads(out))


def test_both_profiles_restore_verified_pages_against_one_direct_read(
    bench: Run, tmp_path: Path
) -> None:
    data = _json(bench, "--backend", "file", "--set", f"backend.options.path={tmp_path}", *SMALL)
    assert data["verified"] is True and data["backend"] == "file"
    assert data["limit_short"] == "one direct sequential read"
    assert data["limit_gigabytes_per_s"] > 0 and data["ratio_to_limit"] > 0
    assert data["transport"]["name"] == "file" and data["transport"]["path"] == str(tmp_path)
    assert data["transport"]["io_engine"] == "thread pool of preadv/pwritev"
    assert {r["side"] for r in data["runs"]} == {"P", "Q"}
    for run in data["runs"]:
        assert run["verified"] and run["limit_gigabytes_per_s"] > 0
    assert list(tmp_path.iterdir()) == []  # each side's folder is removed


def test_a_folder_is_required_and_must_exist(bench: Run, tmp_path: Path) -> None:
    code, _, err = bench("--backend", "file", *SMALL)
    assert code != 0 and "--set backend.options.path=DIR" in err
    missing = tmp_path / "nowhere"
    code, _, err = bench("--backend", "file", "--set", f"backend.options.path={missing}", *SMALL)
    assert code != 0 and "is not a folder" in err


@pytest.mark.sglang
def test_against_hicache_file_in_the_same_folder(
    bench: Run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if importlib.util.find_spec("sglang") is None:
        pytest.skip("sglang==0.5.23 is not installed; run `bash .ci/install-sglang.sh`")
    monkeypatch.delenv("SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR", raising=False)
    data = _json(bench, "--backend", "file", "--set", f"backend.options.path={tmp_path}",
                 "--peer", "hicache-file", *SMALL)  # fmt: skip
    assert data["verified"] is True and data["peer"] == "hicache-file"
    assert data["peer_gigabytes_per_s"] > 0 and data["speedup_vs_peer"] > 0
    assert data["profiles"]["peer"]["path"] == str(tmp_path)  # the same file system
    assert list(tmp_path.iterdir()) == []
