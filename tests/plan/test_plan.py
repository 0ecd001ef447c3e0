"""``kvcr-policy plan``: figures, refusals that name values and origins, and a plan that a real
restore confirms (same profile, same geometry: the pipeline's own counters)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from kvcr_policy.config.loading import load_config
from kvcr_policy.geometry import preset
from kvcr_policy.memory.linux import use_roots
from kvcr_policy.pipeline import build_pipeline
from kvcr_policy.registry import Registry
from tests.support.cgroups import FakeHost
from tests.support.commands import run_main

pytestmark = pytest.mark.usefixtures("clean_env")

QWEN = ["--geometry", "qwen3-32b", "--tp", "8", "--tokens", "115968", "--host-memory", "2TiB"]
Run = Callable[..., tuple[int, str, str]]


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Run:
    """``cli(*argv)``: ``kvcr-policy plan ARGV`` in-process, in an 80-column terminal."""
    monkeypatch.setenv("COLUMNS", "80")
    return lambda *argv: run_main(capsys, "plan", *argv)


def _json(cli: Run, *argv: str) -> tuple[int, dict[str, Any], str]:
    code, out, err = cli(*argv, "--format", "json")
    return code, json.loads(out), err


def test_the_qwen3_plan(cli: Run) -> None:
    code, out, err = cli(*QWEN, "--profile", "throughput")
    assert code == 0, err
    assert max(len(line) for line in out.splitlines()) <= 80
    for text in (
        "32KiB per rank, 256KiB for the model",
        "2MiB per rank (64 tokens; 128 fragments of 16KiB)",
        "32GiB (8 ranks) (1.6% of 2TiB)",
        "2048 per rank, 16384 per host of 2MiB",
        "2048 pages = 131072 tokens per pool per rank",
        "115968 tokens = 1812 pages, 3.54GiB per rank",
        "8 of up to 256 pages; 4 in flight (2 windows)",
        "231936 before coalescing, 1024 after, 1024 after split",
        "mirror the pool's planes",
        "no link limit",
    ):
        assert text in out, text
    code, plan, _ = _json(cli, *QWEN, "--profile", "throughput", "--link-limit", "50GB/s")
    assert code == 0
    assert plan["tier"]["bytes_per_host"] == 8 * (4 << 30)
    assert plan["restore"]["bytes"] == 1812 * (2 << 20)
    # The host's 8 ranks restore their 3.54 GiB each at once through the host's 50 GB/s.
    restore = plan["restore"]
    assert restore["predicted_seconds"] == pytest.approx(8 * 1812 * (2 << 20) / 50e9)
    assert restore["link_per"] == "host" and restore["ranks_restoring_at_once"] == 8
    assert restore["link_gigabytes_per_s_per_rank"] == pytest.approx(50 / 8)
    assert restore["bytes_per_host"] == 8 * restore["bytes"]
    assert plan["refusals"] == [] and plan["warnings"] == []


@pytest.mark.parametrize(
    ("how", "origin"),
    [
        (("--set", "placement.capacity_bytes=300GiB"), "(from override)"),
        (("env",), "(from env KVCR_POLICY_PLACEMENT__CAPACITY_BYTES)"),
        (("file",), "(from profile ./site.toml [placement])"),
    ],
)
def test_a_tier_larger_than_the_host_is_refused(
    cli: Run,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    how: tuple[str, ...],
    origin: str,
) -> None:
    argv = list(how)
    if how == ("env",):
        monkeypatch.setenv("KVCR_POLICY_PLACEMENT__CAPACITY_BYTES", "300GiB")
        argv = []
    elif how == ("file",):
        (tmp_path / "site.toml").write_text('[placement]\ncapacity_bytes = "300GiB"\n')
        monkeypatch.chdir(tmp_path)
        argv = ["--profile", "site.toml"]
    code, out, err = cli(*QWEN, *argv)
    assert code == 2
    assert f"placement.capacity_bytes = 300GiB {origin}" in err
    assert "8 ranks per host" in err and "2.34TiB" in err
    assert "2TiB of memory (from --host-memory)" in err
    assert "per host" in out  # the figures are still shown


def test_a_tier_that_holds_no_page_is_refused(cli: Run) -> None:
    code, plan, err = _json(cli, "--geometry", "qwen3-32b", "--tokens", "64", "--host-memory",
                            "1TiB", "--set", "placement.capacity_bytes=8MiB")  # fmt: skip
    assert code == 2
    assert plan["tier"]["pages_per_pool"] == 0
    assert "placement.capacity_bytes = 8MiB (from override) holds no page of 16MiB" in err


def test_a_window_smaller_than_one_batch_is_refused(cli: Run) -> None:
    code, _, err = cli(*QWEN, "--profile", "throughput", "--set", "batching.window_bytes=256MiB")
    assert code == 2
    assert "batching.window_bytes = 256MiB (from override) is smaller than one batch" in err
    assert "batching.read_batch_pages = 256 (from throughput [batching]) x 2MiB = 512MiB" in err


def test_tp_that_fits_no_head_layout_is_refused(cli: Run) -> None:
    code, _, err = cli("--geometry", "qwen3-32b", "--tp", "3", "--tokens", "64")
    assert code == 2
    assert "--tp 3 (from --tp) neither divides nor is a multiple of the 8 KV heads" in err


def test_risky_plans_warn(cli: Run) -> None:
    code, plan, _ = _json(cli, "--geometry", "qwen3-32b", "--tokens", "115968", "--host-memory",
                          "40GiB", "--set", "placement.capacity_bytes=32GiB")  # fmt: skip
    assert code == 0
    warnings = " ".join(plan["warnings"])
    assert "the tier takes 80% of the host's memory" in warnings
    assert "more than the 2048 tokens" not in warnings  # 32GiB holds 2048 pages of 16MiB
    code, plan, _ = _json(cli, *QWEN, "--set", "placement.capacity_bytes=1GiB")
    assert "--tokens 115968 (from --tokens) is more than the 32768 tokens" in plan["warnings"][0]


def test_a_geometry_is_required(cli: Run) -> None:
    code, _, err = cli("--tokens", "64", "--layers", "4")
    assert code == 2
    assert "missing: heads, head_dim, dtype, page_size" in err


def test_explicit_dimensions_and_mla(cli: Run) -> None:
    code, plan, err = _json(cli, "--layers", "61", "--heads", "1", "--head-dim", "576",
                            "--dtype", "bfloat16", "--page-size", "64", "--mla", "--tp", "8",
                            "--tokens", "4096", "--host-memory", "1TiB")  # fmt: skip
    assert code == 0, err
    geometry = plan["geometry"]
    # The MLA latent is replicated on every TP rank: per rank as much as for the model.
    assert geometry["bytes_per_token_rank"] == geometry["bytes_per_token_model"] == 61 * 576 * 2
    assert geometry["fragments_per_page"] == 61


@pytest.mark.parametrize("least", [None, "160MiB"], ids=["strategy", "joined"])
def test_a_real_restore_confirms_the_plan(cli: Run, registry: Registry, least: str | None) -> None:
    """The plan's batches, window and descriptors equal what the pipeline counts when it
    restores the same prefix with the same profile (with batches joined to
    batching.read_batch_bytes too: 320 pages of 512 KiB, so the 300 pages in one batch, not the
    profile's 256 and 44)."""
    tokens = 16 * 300  # 300 pages of the 'small' geometry (512 KiB each)
    joined = () if least is None else ("--set", f"batching.read_batch_bytes={least}")
    code, plan, err = _json(cli, "--geometry", "small", "--tokens", str(tokens), "--profile",
                            "throughput", "--set", "placement.capacity_bytes=256MiB",
                            *joined)  # fmt: skip
    assert code == 0, err
    restore = plan["restore"]
    if least is not None:
        assert (restore["batches"], restore["pages_per_batch"]) == (1, 300)
    overrides = {"placement.capacity_bytes": "256MiB", "observability.metrics": False}
    if least is not None:
        overrides["batching.read_batch_bytes"] = least
    loaded = load_config("throughput", environ={}, overrides=overrides, registry=registry)
    geometry = preset("small", layout="layer_first", tokens=tokens)
    with build_pipeline(loaded) as pipeline:
        buffer = torch.zeros(geometry.shape, dtype=torch.bfloat16)
        pipeline.register_pool("kv", geometry, buffer)
        keys = [f"p{i}" for i in range(300)]
        assert pipeline.set(keys, np.arange(tokens)) == [True] * 300
        before = pipeline.stats()
        assert pipeline.get(keys, np.arange(tokens)) == [True] * 300
        after = pipeline.stats()
    assert restore["pages"] == 300
    assert restore["batches"] == after.batches - before.batches
    assert restore["batches_in_flight"] == after.peak_inflight_batches
    assert restore["descriptors_before_coalescing"] == (
        after.descriptors_before - before.descriptors_before
    )
    assert restore["descriptors_after_split"] == after.descriptors_after - before.descriptors_after


def test_a_measured_link(cli: Run) -> None:
    code, plan, err = _json(cli, "--geometry", "small", "--tokens", "4096", "--measure-link",
                            "--set", "placement.capacity_bytes=128MiB")  # fmt: skip
    assert code == 0, err
    restore = plan["restore"]
    assert restore["link_gigabytes_per_s"] > 0
    assert restore["link_from"].startswith("measured here")
    assert restore["predicted_seconds"] == pytest.approx(
        restore["bytes"] / restore["link_gigabytes_per_s"] / 1e9
    )


def test_the_plan_predicts_the_tier_layout_the_cuda_transport_uses(cli: Run) -> None:
    """With the staging ring on (``throughput`` on cuda) the tier keeps slots whole, so no two
    fragments of a page coalesce; ``tier_slots = "mirror"`` (or the cpu transport) mirrors the
    pool's planes. The layout is resolved without a GPU, as the transport resolves it."""
    common = ("--geometry", "small", "--tokens", "4096", "--profile", "throughput",
              "--set", "placement.capacity_bytes=64MiB")  # fmt: skip
    code, whole, err = _json(cli, *common, "--set", "transport.name=cuda")
    assert code == 0, err
    restore = whole["restore"]
    assert restore["tier_slots"] == "whole"
    assert restore["descriptors_after_coalescing"] == restore["descriptors_before_coalescing"]
    mirror_set = ("--set", "transport.options.tier_slots=mirror")
    code, mirror, err = _json(cli, *common, "--set", "transport.name=cuda", *mirror_set)
    assert code == 0, err
    assert mirror["restore"]["tier_slots"] == "mirror"
    code, cpu, err = _json(cli, *common)
    assert code == 0, err
    assert cpu["restore"]["tier_slots"] == "mirror"


def test_without_host_memory_the_plan_reads_the_memory_cgroups_limit(
    cli: Run, tmp_path: Path
) -> None:
    """Faked: a 64 GiB v2 pod on a 1 TiB host (this machine has neither)."""
    host = FakeHost(tmp_path, total=1 << 40, available=1 << 39)
    host.v2("/pod")
    host.limit_v2("/sys/fs/cgroup/pod", 64 << 30, current=1 << 30)
    with use_roots(proc=host.proc, sys=host.sys):
        code, plan, err = _json(cli, "--geometry", "qwen3-32b", "--tp", "8", "--tokens", "4096",
                                "--set", "placement.capacity_bytes=16GiB")  # fmt: skip
    limit, figures = host.sys / "fs/cgroup/pod/memory.max", plan["geometry"]
    assert code == 2 and figures["host_memory"] == 64 << 30
    assert figures["host_memory_from"] == f"this machine's cgroup v2 memory.max ({limit})"
    assert f"64GiB of memory (from this machine's cgroup v2 memory.max ({limit}))" in err


def test_no_restore_time_for_a_prefix_larger_than_the_tier(cli: Run) -> None:
    """A 4 GiB tier holds 131,072 tokens per rank: a 1M-token prefix is not restored whole, so
    no time is predicted for it, only for the tokens the tier holds (at the host's link shared
    by its 8 ranks)."""
    argv = ("--geometry", "qwen3-32b", "--tp", "8", "--tokens", "1000000", "--host-memory",
            "2TiB", "--profile", "throughput", "--link-limit", "50GB/s")  # fmt: skip
    code, plan, err = _json(cli, *argv)
    assert code == 0, err
    restore = plan["restore"]
    assert restore["predicted_seconds"] is None and restore["held_tokens"] == 131072
    held = 131072 // 64 * (2 << 20)
    assert restore["predicted_seconds_held"] == pytest.approx(8 * held / 50e9)
    assert any(w.startswith("no restore time for a prefix of 1000000 tokens")
               for w in plan["warnings"])  # fmt: skip
    code, out, err = cli(*argv)
    text = " ".join(out.split())  # the table wraps at 80 columns
    assert code == 0 and "none for the whole prefix" in text, err
    assert "50.0 GB/s per host (from --link-limit), shared by its 8 rank(s): 6.25 GB/s" in text
