"""P against SGLang's HiCacheFile, end to end on a tiny real host pool, every byte verified."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from kvcr_policy.bench import BenchSetup, run_bench

pytestmark = pytest.mark.sglang


@pytest.fixture(autouse=True)
def _sglang(monkeypatch: pytest.MonkeyPatch) -> None:
    if importlib.util.find_spec("sglang") is None:
        pytest.skip("sglang==0.5.23 is not installed; run `bash .ci/install-sglang.sh`")
    monkeypatch.delenv("SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR", raising=False)


def test_both_sides_restore_verified_pages_and_hicache_files_are_removed(tmp_path: Path) -> None:
    setup = BenchSetup(
        "throughput",
        geometry="small",
        layout="page_head",
        tokens=64 * 16,
        repeat=1,
        peer="hicache-file",
        exists_keys=500,
        folder=str(tmp_path),
    )
    data = run_bench(setup).to_dict()
    assert data["verified"] is True
    assert (data["pages"], data["bytes"]) == (64, 64 * data["page_bytes"])
    assert set(data["orders"]) == {"P,peer", "peer,P"}
    assert [r["side"] for r in data["runs"]] == ["P", "peer", "peer", "P"]
    for key in (
        "peer_gigabytes_per_s",
        "restore_gigabytes_per_s",
        "store_gigabytes_per_s",
        "peer_store_gigabytes_per_s",
        "limit_gigabytes_per_s",
        "host_copy_limit_gigabytes_per_s",
        "ratio_to_host_copy_limit",
        "baseline_ratio_to_host_copy_limit",
        "store_host_copy_limit_gigabytes_per_s",
    ):
        assert data[key] > 0
    assert (data["profile"], data["peer"]) == ("throughput", "hicache-file")
    assert data["profiles"]["peer"] == {"name": "hicache-file", "path": str(tmp_path)}
    assert "Q" not in data["descriptors"] and "baseline_exists_keys_per_s" not in data
    assert list(tmp_path.iterdir()) == []  # HiCacheFile's folder is removed
