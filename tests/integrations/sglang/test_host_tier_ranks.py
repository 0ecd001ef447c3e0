"""TP ranks of one host share one tier: what rank 0 stores of an MLA model, every rank reads.

Each rank is its own process, built through SGLang's own factory with the documented default
set-up (no backend named: ``auto``), as SGLang's scheduler processes build it. SGLang writes
MLA pages from TP rank 0 only and uses the minimum of the ranks' hits, so before the host tier
every rank but 0 saw none of them (rank 1: 0/8).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kvcr_policy.errors import ConfigError
from tests.support.paths import ROOT

pytestmark = pytest.mark.sglang


def run_ranks(size: int, mla: bool, folder: Path, extra: dict[str, Any] | None = None) -> list:
    stored = folder / "stored"
    args = [str(size), "mla" if mla else "mha", str(stored), json.dumps(extra or {})]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.integrations.sglang.host_rank", str(rank), *args],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(size)
    ]
    lines = []
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-4000:]
        lines.append(json.loads(out.strip().splitlines()[-1]))
    return sorted(lines, key=lambda line: line["rank"])


@pytest.mark.slow
@pytest.mark.parametrize("size", [2, 8])
def test_mla_pages_rank_0_stores_are_read_byte_exact_by_every_rank(
    sg: Any, tmp_path: Path, size: int
) -> None:
    folder = str(tmp_path / "t")
    extra = {"overrides": {"placement.capacity_bytes": "64MiB", "backend.options.dir": folder}}
    lines = run_ranks(size, True, tmp_path, extra)
    assert [line["hits"] for line in lines] == [8] * size
    assert [line["exact"] for line in lines] == [8] * size
    assert {line["backend"] for line in lines} == {"host"}
    assert "SGLang MLA at tp" in lines[1]["origin"]


@pytest.mark.slow
def test_mha_shards_stay_per_rank_on_the_host_tier(sg: Any, tmp_path: Path) -> None:
    overrides = {"backend.name": "host", "backend.options.dir": str(tmp_path / "t")}
    lines = run_ranks(2, False, tmp_path, {"overrides": overrides})
    # Rank 0 stored its shard; rank 1's keys name its own shard, which nobody stored.
    assert [line["hits"] for line in lines] == [8, 0]
    assert lines[0]["exact"] == 8
    assert {line["backend"] for line in lines} == {"host"}


def test_a_private_tier_for_mla_at_tp_2_is_refused_with_the_fix(sg: Any, make_backend: Any) -> None:
    overrides = {"backend.name": "dram"}
    with pytest.raises(ConfigError) as caught:
        make_backend({"is_mla_model": True, "tp_size": 2, "tp_rank": 1}, overrides=overrides)
    text = str(caught.value)
    assert "backend.name" in text and "['overrides']" in text
    assert "MLA pages from TP rank 0 only" in text and "backend.name = 'host'" in text


@pytest.mark.parametrize(
    "fields", [{"is_mla_model": True}, {"is_mla_model": False, "tp_size": 2, "tp_rank": 1}]
)
def test_auto_keeps_the_private_tier_where_no_rank_reads_anothers_pages(
    sg: Any, make_backend: Any, fields: dict[str, Any]
) -> None:
    backend = make_backend(fields)  # MLA at TP 1, and MHA at TP 2: as before
    assert backend.pipeline.backend.name == "dram"
