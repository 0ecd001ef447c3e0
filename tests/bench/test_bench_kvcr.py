"""The kvcr backend in the benchmark: the real KVCR runner per side, the limit one NIXL transfer
of the same bytes between the same memory, the same JSON keys as every bench."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvcr_policy.bench import BenchSetup, run_bench
from kvcr_policy.bench.backends import default_backend
from kvcr_policy.cli import main
from kvcr_policy.config.loading import load_config
from kvcr_policy.geometry import PoolGeometry
from kvcr_policy.pipeline import build_pipeline
from tests.conftest import kvcr_missing
from tests.support.installs import missing


@pytest.fixture(autouse=True)
def _kvcr() -> None:
    reason = kvcr_missing()
    if reason is not None:
        missing(reason)


def _setup(backend: str) -> BenchSetup:
    return BenchSetup(
        "throughput", "default", "small", "page_first", 64, 1, backend=backend, exists_keys=300
    )


def test_a_kvcr_run_restores_verified_bytes_with_the_keys_of_every_bench() -> None:
    data = run_bench(_setup("kvcr")).to_dict()
    assert data["verified"] is True and data["backend"] == "kvcr"
    assert data["limit"].startswith("one NIXL transfer of the same bytes")
    assert data["limit_gigabytes_per_s"] > 0 and data["restore_gigabytes_per_s"] > 0
    assert data["limit_short"] == "one NIXL transfer"
    assert data["host_copy_limit_gigabytes_per_s"] > 0 and data["ratio_to_host_copy_limit"] > 0
    assert data["transport"]["name"] == "kvcr" and data["transport"]["capabilities"] == []
    assert data["descriptors"]["P"]["before"] == data["descriptors"]["P"]["after"]
    dram = run_bench(_setup("dram")).to_dict()
    assert set(data) == set(dram)
    assert set(data["orders"]["P,Q"]) == set(dram["orders"]["P,Q"])


def test_probe_is_one_nixl_transfer_from_kvcrs_region_into_the_pool() -> None:
    geometry = PoolGeometry("kv", "page_first", 2, 2, 8, "uint8", 4, 32)  # 8 pages of 256 B
    overrides = {"backend.name": "kvcr", "placement.capacity_bytes": geometry.nbytes}
    with build_pipeline(load_config("default", environ={}, overrides=overrides)) as pipeline:
        buffer = np.random.default_rng(5).integers(0, 256, geometry.shape, dtype=np.uint8)
        pipeline.register_pool("kv", geometry, buffer)
        assert all(pipeline.set([f"k{i}" for i in range(8)], np.arange(32)))
        region = pipeline._pools["kv"][1].region.array
        buffer[...] = 0
        pipeline.probe(1000)
        assert np.array_equal(buffer.reshape(-1)[:1000], region[:1000])
        assert region[:1000].any() and not buffer.reshape(-1)[1000:].any()


def test_a_profile_that_names_kvcr_benches_kvcr(tmp_path: Path) -> None:
    profile = tmp_path / "kvcr.toml"
    profile.write_text('[backend]\nname = "kvcr"\n', encoding="utf-8")
    assert default_backend(load_config(profile, environ={})) == "kvcr"
    assert default_backend(load_config("default", environ={})) == "dram"


def test_the_command_runs_the_kvcr_backend(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from functools import partial

    from kvcr_policy.bench import command

    # The metadata figure stores 100,000 keys per side by default: a few hundred suffice here.
    monkeypatch.setattr(command, "BenchSetup", partial(BenchSetup, exists_keys=300))
    argv = ["bench", "--backend", "kvcr", "--geometry", "small", "--layout", "layer_first",
            "--tokens", "64", "--repeat", "1", "--format", "json"]  # fmt: skip
    code: Any = None
    try:
        main(argv)
    except SystemExit as stop:
        code = stop.code
    assert code in (None, 0)
    data = json.loads(capsys.readouterr().out)
    assert data["backend"] == "kvcr" and data["verified"] is True
    # The plain command stages these small layer_first pages under throughput (P), and says so.
    staging = data["transport"]["staging"]
    assert staging["value"] == "auto" and list(staging["pools"]) == ["kv"]
    assert "with_coalescing -> auto (coalescing.strategy = 'contiguous'" in staging["source"]
