"""Misuse of the Python API from the red team's report (2026-12-01, S8, S9, S11): memory a get
would corrupt or crash on is refused, every misuse raises from the error tree with what was
expected, and close() unmaps whatever failed before it.

The cases that crashed the process (SIGSEGV) run in a child process, so that a regression
fails the test instead of killing the suite.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvcr_policy import build_pipeline, load_config
from kvcr_policy.errors import KVCRPolicyError, PoolError, UsageError
from kvcr_policy.geometry import PoolGeometry
from kvcr_policy.registry import Registry

GEO = PoolGeometry("kv", "layer_first", 2, 2, 8, "float16", 4, 32)
CAPACITY = {"placement.capacity_bytes": 8 * GEO.page_bytes}


def _pipeline(registry: Registry, **overrides: Any) -> Any:
    loaded = load_config(environ={}, overrides={**CAPACITY, **overrides}, registry=registry)
    return build_pipeline(loaded)


def _child(code: str) -> subprocess.CompletedProcess[str]:
    prelude = """
        import numpy as np, torch
        from kvcr_policy import build_pipeline, load_config
        from kvcr_policy.errors import PoolError
        from kvcr_policy.geometry import PoolGeometry
        geo = PoolGeometry("kv", "layer_first", 2, 2, 8, "float16", 4, 32)
        p = build_pipeline(load_config(environ={}, overrides={
            "placement.capacity_bytes": 8 * geo.page_bytes}))
    """
    script = textwrap.dedent(prelude) + textwrap.dedent(code)
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )


def test_an_array_over_immutable_bytes_is_refused_and_never_written(registry: Registry) -> None:
    data = bytes(GEO.nbytes)
    readonly = np.frombuffer(data, dtype=np.float16).reshape(GEO.shape)
    with _pipeline(registry) as pipeline:
        with pytest.raises(PoolError, match="writability: expected a writeable array"):
            pipeline.register_pool("kv", GEO, readonly)
        assert "kv" in pipeline.refused
    assert data == bytes(GEO.nbytes)


def test_a_read_only_memmap_is_refused_instead_of_crashing(tmp_path: Path) -> None:
    path = tmp_path / "pool.bin"
    path.write_bytes(bytes(GEO.nbytes))
    done = _child(f"""
        mm = np.memmap({str(path)!r}, dtype=np.float16, mode="r", shape=geo.shape)
        try:
            p.register_pool("kv", geo, mm)
        except PoolError as err:
            print("refused:", err)
        # A tensor over the same read-only mapping: numpy's flag is gone, the mapping is not.
        t = torch.from_numpy(np.array(mm, copy=False))
        try:
            p.register_pool("kv2", geo, t)
        except PoolError as err:
            print("refused:", err)
    """)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "refused: pool 'kv' refused: buffer writability" in done.stdout
    assert "refused: pool 'kv2' refused: buffer memory" in done.stdout


@pytest.mark.parametrize("free", ["p.set_()", "p.untyped_storage().resize_(0)"])
def test_a_pool_whose_storage_was_freed_is_refused_on_the_next_call(free: str) -> None:
    done = _child(f"""
        pool = torch.zeros(geo.shape, dtype=torch.float16)
        p.register_pool("kv", geo, pool)
        keys = ["a", "b"]
        assert p.set(keys, np.arange(8)) == [True, True]
        {free.replace("p.", "pool.")}
        try:
            p.get(keys, np.arange(8))
        except PoolError as err:
            print("refused:", err)
    """)
    assert done.returncode == 0, done.stderr[-2000:]  # was SIGSEGV (rc -11)
    assert "refused: pool 'kv': its buffer changed since register_pool" in done.stdout


def test_misuse_raises_from_the_tree_saying_what_was_expected(registry: Registry) -> None:
    cases = [
        (lambda: load_config(profile=123), "profile must be a name or a path"),  # type: ignore[arg-type]
        (lambda: load_config(overrides=[("a", 1)]), "overrides must be a mapping"),  # type: ignore[arg-type]
        (lambda: load_config(environ={"KVCR_POLICY_X": 5}), "environ must map str to str"),  # type: ignore[dict-item]
        (lambda: build_pipeline("throughput"), "expected a LoadedConfig"),  # type: ignore[arg-type]
    ]
    for call, says in cases:
        with pytest.raises(UsageError, match=says):
            call()
    with _pipeline(registry) as pipeline:
        with pytest.raises(UsageError, match="name must be a non-empty str"):
            pipeline.register_pool(7, GEO, np.zeros(GEO.shape, dtype=np.float16))  # type: ignore[arg-type]
        with pytest.raises(UsageError, match=r"geometry must be a kvcr_policy\.geometry"):
            pipeline.register_pool("kv", "small", np.zeros(GEO.shape, dtype=np.float16))  # type: ignore[arg-type]
        pipeline.register_pool("kv", GEO, np.zeros(GEO.shape, dtype=np.float16))
        with pytest.raises(UsageError, match="got generator"):
            pipeline.set((k for k in "ab"), np.arange(8))
        with pytest.raises(UsageError, match="must be a str, got list"):
            pipeline.exists([["unhashable"]])
        with pytest.raises(UsageError, match="pool must be a str"):
            pipeline.exists(["a"], pool=3)  # type: ignore[arg-type]
    for call, _ in cases:  # TypeError and ValueError still catch them, as before
        with pytest.raises((TypeError, ValueError, KVCRPolicyError)):
            call()


def test_close_unmaps_every_tier_whatever_fails_first(
    registry: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    pipeline = _pipeline(registry, **{"thread_tuning.switch_interval_s": 0.001})
    for name in ("a", "b"):
        pipeline.register_pool(name, GEO, np.zeros(GEO.shape, dtype=np.float16))
    pools = pipeline.backend._pools
    regions = [pool.region for pool in pools]

    def broken() -> None:
        raise RuntimeError("thread tuning could not restore")

    monkeypatch.setattr(pipeline.thread_tuning, "restore", broken)
    failing = pools[0]
    original = failing.close

    def close_then_fail() -> None:
        original()
        raise OSError("unpinning failed")

    monkeypatch.setattr(failing, "close", close_then_fail)
    with pytest.raises((RuntimeError, OSError)):
        pipeline.close()
    assert pipeline.state == "closed"
    assert all(region.audit().state == "closed" for region in regions)
