"""The HiCacheFile comparison runs end to end on a tiny pool and verifies what it restores."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from kvcr_policy.errors import PoolError
from kvcr_policy.integrations.sglang_bench import run_peer_bench

pytestmark = pytest.mark.sglang


def test_peer_bench_verifies_both_backends_and_cleans_up(
    sg: SimpleNamespace, tmp_path: Path
) -> None:
    result = run_peer_bench(
        "throughput",
        tokens=64 * 16,
        layout="page_head",
        geometry_name="small",
        repeat=1,
        folder=str(tmp_path),
    )
    assert result["verified"] is True
    assert (result["pages"], result["bytes"]) == (64, 64 * result["page_bytes"])
    assert set(result["orders"]) == {"peer,P", "P,peer"}
    assert [r["side"] for r in result["runs"]] == ["peer", "P", "P", "peer"]
    assert all(r["verified"] for r in result["runs"])
    for key in ("peer_gbps", "restore_gbps", "store_gbps", "peer_store_gbps", "limit_gbps"):
        assert result[key] > 0
    speedup = result["restore_gbps"] / result["peer_gbps"]
    assert result["speedup_vs_peer"] == pytest.approx(speedup, rel=0.01)
    assert result["profile"] == "throughput" and result["peer"] == "hicache-file"
    assert list(tmp_path.iterdir()) == []  # HiCacheFile's folder is removed


def test_peer_bench_names_the_presets(sg: SimpleNamespace) -> None:
    with pytest.raises(PoolError, match="qwen3-32b"):
        run_peer_bench(None, tokens=64, geometry_name="nope", repeat=1)
