"""Every input is checked before anything starts: one clear error, nothing filled or spawned."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvcr_policy import bench_adapter
from kvcr_policy.backends.peer.process import PeerProcess
from kvcr_policy.bench import BenchError, BenchSetup, hicache
from kvcr_policy.bench import targets as bench_targets
from kvcr_policy.bench.backends import bench_backends
from kvcr_policy.bench.resolve import resolve
from kvcr_policy.errors import ConfigError, KVCRPolicyError, PoolError
from kvcr_policy.memory.linux import use_roots
from tests.support.cgroups import MIB, FakeHost

SMALL: dict[str, Any] = dict(geometry="small", tokens=256, repeat=1)


@pytest.fixture(autouse=True)
def _nothing_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Resolving never starts a server (and, being quick, never fills memory)."""

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("resolve started a peer server")

    monkeypatch.setattr(PeerProcess, "__init__", refuse)


def test_unknown_backend_names_the_known_ones() -> None:
    known = ", ".join(sorted(bench_backends()))
    # dram and peer are built in; kvcr and mooncake come from their plugins' hook
    assert {"dram", "kvcr", "mooncake", "peer"} <= set(bench_backends())
    with pytest.raises(BenchError, match=rf"unknown backend 'nope'; expected one of: {known}$"):
        resolve(BenchSetup(**SMALL, backend="nope"))


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"geometry": "llama-9000"}, r"unknown geometry 'llama-9000'; expected one of: qwen3-32b"),
        ({"layout": "row_major"}, r"unknown layout 'row_major'; expected one of: layer_first"),
        ({"tokens": 100}, r"whole pages of 'small' \(16 tokens each\), got 100; try --tokens 96"),
        ({"tokens": 8}, r"got 8; try --tokens 16"),
        ({"repeat": 0}, r"--repeat: expected a positive count, got 0"),
        ({"target": "tpu"}, r"unknown target 'tpu'; expected one of: cpu, cuda"),
        ({"peer": "hicache-mem"}, r"unknown peer implementation 'hicache-mem'"),
    ],
)
def test_bad_sizes_and_names_are_refused(fields: dict[str, Any], match: str) -> None:
    with pytest.raises(BenchError, match=match):
        resolve(BenchSetup(**{**SMALL, **fields}))


def test_an_mla_page_head_pool_is_refused_by_the_geometry() -> None:
    with pytest.raises(PoolError, match="layout"):
        resolve(BenchSetup(**SMALL, layout="page_head", mla=True))


def test_every_profile_and_set_value_loads_first() -> None:
    with pytest.raises(ConfigError, match="nope"):
        resolve(BenchSetup(**SMALL, vs="nope"))
    with pytest.raises(ConfigError, match=r"batching\.read_batch_pages"):
        resolve(BenchSetup(**SMALL, overrides={"batching.read_batch_pages": "many"}))


def test_the_backend_defaults_to_the_profiles(
    write_profile: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert resolve(BenchSetup(**SMALL)).backend.name == "dram"
    ucx: Path = write_profile('[transport]\nname = "ucx"\n')
    monkeypatch.setattr(bench_adapter, "find_spec", lambda name: object())
    plan = resolve(BenchSetup(**SMALL, profile=str(ucx)))
    assert plan.backend.name == "peer"
    assert plan.backend.planned()["transport.name"] == "ucx"


def test_a_missing_optional_module_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(bench_adapter, "find_spec", lambda name: None)
    with pytest.raises(
        BenchError,
        match=r"needs ucxx.*torch==2\.13\.0 -e '\.\[ucx\]' in the kvcr-policy",
    ):
        resolve(BenchSetup(**SMALL, backend="peer"))
    monkeypatch.setattr(hicache, "find_spec", lambda name: None)
    with pytest.raises(BenchError, match=r"needs sglang==0\.5\.23"):
        resolve(BenchSetup(**SMALL, peer="hicache-file"))


def test_the_peer_backend_serves_host_pools_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench_adapter, "find_spec", lambda name: object())
    with pytest.raises(BenchError, match=r"backend 'peer' cannot serve a cuda pool"):
        resolve(BenchSetup(**SMALL, backend="peer", target="cuda"))


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"target": "cuda"}, "--target cpu"),
        ({"backend": "peer"}, "--backend dram"),
        ({"mla": True}, "drop --mla"),
    ],
)
def test_hicache_file_runs_on_a_local_mha_host_pool(
    fields: dict[str, Any], match: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bench_adapter, "find_spec", lambda name: object())
    with pytest.raises(BenchError, match=match):
        resolve(BenchSetup(**{**SMALL, **fields}, peer="hicache-file"))


def test_cuda_without_a_gpu_is_refused_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(KVCRPolicyError, match="no CUDA device visible"):
        resolve(BenchSetup(**SMALL, target="cuda"))


def _no_gpu_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """Faked: this host has no GPU, so the cuda target's free-memory check is skipped; the
    option resolution under test needs none."""
    monkeypatch.setattr(bench_targets.CudaTarget, "check", lambda self, measured: None)


@pytest.mark.parametrize(
    "overrides",
    [
        {"transport.options.staging_buffer_bytes": "64MiB"},
        {"transport.options.staging": "always", "transport.options.staging_buffers": "8"},
    ],
)
def test_set_options_of_the_transport_the_run_uses_are_accepted(
    overrides: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The profile names the cpu transport; --target cuda makes the run use cuda's options."""
    _no_gpu_check(monkeypatch)
    plan = resolve(BenchSetup(**SMALL, target="cuda", overrides=overrides))
    assert plan.target.name == "cuda"
    plan = resolve(BenchSetup(**SMALL, target="cuda", vs_overrides=overrides))
    assert plan.target.name == "cuda"


@pytest.mark.parametrize(
    ("fields", "transport"),
    [
        ({"target": "cuda", "overrides": {"transport.options.min_parallel_bytes": "1"}}, "cuda"),
        ({"target": "cuda", "vs_overrides": {"transport.options.stagin": "auto"}}, "cuda"),
        ({"overrides": {"transport.options.staging_buffer_bytes": "64MiB"}}, "cpu"),
    ],
)
def test_set_options_the_run_transport_lacks_name_it(
    fields: dict[str, Any], transport: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _no_gpu_check(monkeypatch)
    with pytest.raises(ConfigError, match=rf"unknown key.*\[options of transport '{transport}'\]"):
        resolve(BenchSetup(**{**SMALL, **fields}))


def test_a_run_larger_than_its_memory_cgroup_is_refused_naming_the_limit(tmp_path: Path) -> None:
    """Faked: a pod with 1 MiB left under its 64 MiB v2 limit on a 1 TiB host (this machine's
    cgroup has no limit)."""
    host = FakeHost(tmp_path, total=1 << 40, available=1 << 39)
    host.v2("/pod")
    host.limit_v2("/sys/fs/cgroup/pod", 64 * MIB, current=63 * MIB)
    with use_roots(proc=host.proc, sys=host.sys), pytest.raises(BenchError) as caught:
        resolve(BenchSetup(**SMALL))
    text = str(caught.value)
    assert "--tokens 256: the run fills about" in text
    limit = host.sys / "fs/cgroup/pod/memory.max"
    assert f"cgroup v2 memory.max leaves 0.0 GiB ({limit}); lower --tokens" in text
    assert f"or raise memory.max of {limit.parent}" in text
