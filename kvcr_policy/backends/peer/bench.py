"""The ucx benchmark: store through a peer process, restore from it, against a limit of the run.

A ``kvcr-policy serve`` process is started on loopback. Pages of one host pool buffer (first
half) are stored through it, then restored into the second half with the candidate profile and
the baseline profile, alternating which goes first, ``repeat`` times each; every restore is
verified with per-page checksums. Beside each restore, the limit is measured between the same
two processes: one ucxx message of the same number of bytes from the peer's tier into the
pool. Metadata speed is ``exists`` over stored keys against a second, small peer.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from kvcr_policy.errors import KVCRPolicyError
from kvcr_policy.geometry import PoolGeometry, preset
from kvcr_policy.loading import load_config
from kvcr_policy.pipeline import Pipeline, build_pipeline

__all__ = ["PeerProcess", "run_ucx_bench"]

Progress = Callable[[str], None]


class PeerProcess:
    """``kvcr-policy serve`` in a child process; ``address`` once it listens."""

    def __init__(
        self,
        sets: Mapping[str, Any],
        *,
        profile: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float = 60.0,
        listen: str = "127.0.0.1:0",
    ) -> None:
        command = [sys.executable, "-m", "kvcr_policy", "serve", "--listen", listen]
        if profile is not None:
            command += ["--profile", profile]
        for key, value in sets.items():
            command += ["--set", f"{key}={value}"]
        self.proc = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        self.log: list[str] = []
        threading.Thread(target=self._drain, daemon=True).start()
        line = self._first_line(timeout)
        self.address: str = line["listening"]
        self.info = line

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line.rstrip())

    def _first_line(self, timeout: float) -> dict[str, Any]:
        result: list[str] = []
        reader = threading.Thread(
            target=lambda: result.append(self.proc.stdout.readline()),  # type: ignore[union-attr]
            daemon=True,
        )
        reader.start()
        reader.join(timeout)
        if not result or not result[0]:
            self.proc.kill()
            tail = "\n".join(self.log[-20:])
            raise KVCRPolicyError(f"kvcr-policy serve did not start within {timeout} s:\n{tail}")
        return dict(json.loads(result[0]))

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM, then wait; returns the exit code (killed if it overstays)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def _keys(n: int, salt: str) -> list[str]:
    return [hashlib.sha256(f"{salt}:{i}".encode()).hexdigest() for i in range(n)]


def _fill(words: np.ndarray) -> None:
    """A cheap pattern in which every 8-byte word of every page differs."""
    chunk = 1 << 24
    for start in range(0, len(words), chunk):
        stop = min(start + chunk, len(words))
        words[start:stop] = np.arange(start, stop, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)


def _checksums(view: np.ndarray) -> np.ndarray:
    """One 64-bit checksum per page of a (planes, pages, bytes) view: position-weighted sums."""
    planes, pages, nbytes = view.shape
    weights = np.arange(1, nbytes // 8 + 1, dtype=np.uint64) | np.uint64(1)
    out = np.zeros(pages, dtype=np.uint64)
    for plane in range(planes):
        words = np.ascontiguousarray(view[plane]).view(np.uint64)
        out += (words * weights).sum(axis=1, dtype=np.uint64)
    return out


def _pipeline(
    profile: str, overrides: Mapping[str, Any], geometry: PoolGeometry, buffer: Any
) -> Pipeline:
    pipeline = build_pipeline(load_config(profile=profile, overrides=dict(overrides)))
    try:
        pipeline.register_pool(geometry.name, geometry, buffer)
    except BaseException:
        pipeline.close()
        raise
    return pipeline


def _exists_rate(profile: str, overrides: Mapping[str, Any], keys: int, repeat: int) -> float:
    geometry = PoolGeometry("meta", "page_first", 1, 1, 8, "uint8", 1, keys)
    buffer = np.zeros(geometry.shape, dtype=np.uint8)
    names = _keys(keys, "exists")
    with _pipeline(profile, overrides, geometry, buffer) as pipeline:
        stored = pipeline.set(names, np.arange(keys))
        if not all(stored):
            raise KVCRPolicyError(f"the metadata peer stored {sum(stored)} of {keys} keys")
        timings = []
        for _ in range(repeat):
            start = time.perf_counter()
            found = pipeline.exists(names)
            timings.append(time.perf_counter() - start)
            if found != keys:
                raise KVCRPolicyError(f"exists found {found} of {keys} stored keys")
    return keys / statistics.median(timings)


def _restore(
    pipeline: Pipeline,
    keys: list[str],
    dst_idx: np.ndarray,
    view: np.ndarray,
    n_pages: int,
    expected: np.ndarray,
) -> dict[str, Any]:
    """One run: the limit (one ucxx message of the same bytes, peer tier -> pool), then the
    restore into the second half of the pool, verified by checksums."""
    nbytes = view[:, :n_pages].nbytes
    remote = pipeline.transport.remote_pool("kv")
    start = time.perf_counter()
    probed = remote.probe(nbytes)
    limit_s = time.perf_counter() - start
    view[:, n_pages:] = 0
    start = time.perf_counter()
    got = pipeline.get(keys, dst_idx)
    seconds = time.perf_counter() - start
    same = np.array_equal(_checksums(view[:, n_pages:]), expected)
    return {
        "restore_gbps": nbytes / seconds / 1e9,
        "limit_gbps": nbytes / limit_s / 1e9,
        "verified": bool(all(got)) and bool(same) and probed,
    }


def run_ucx_bench(
    profile: str,
    vs: str,
    *,
    geometry_name: str = "qwen3-32b",
    layout: str = "layer_first",
    tokens: int = 4096,
    repeat: int = 3,
    tls: str = "auto",
    mla: bool = False,
    exists_keys: int = 100_000,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """See the module docstring; returns the figures as a JSON-ready dict."""
    import torch

    say = progress or (lambda message: None)
    half = replace(preset(geometry_name, layout=layout, tokens=tokens, mla=mla), name="kv")  # type: ignore[arg-type]
    n_pages, nbytes = half.pages, half.nbytes
    geometry = half.with_tokens(2 * tokens)
    raw = np.empty(geometry.nbytes, dtype=np.uint8)  # numpy: huge pages, unlike torch.empty
    tensor = torch.from_numpy(raw).view(getattr(torch, geometry.dtype)).reshape(geometry.shape)
    view = raw.reshape(geometry.fragments_per_page, geometry.pages, geometry.fragment_bytes)
    say(f"filling {nbytes / 2**30:.2f} GiB of source pages")
    _fill(raw.view(np.uint64))
    expected = _checksums(view[:, :n_pages])
    page = geometry.page_size
    src_idx = np.arange(n_pages * page, dtype=np.int64)
    dst_idx = src_idx + n_pages * page
    keys = _keys(n_pages, "bench")
    transport = {
        "transport.name": "ucx",
        "transport.options.tls": tls,
        "transport.options.net_devices": "lo",
    }
    capacity = nbytes + half.page_bytes
    peer = PeerProcess({**transport, "placement.capacity_bytes": capacity}, profile=profile)
    overrides = {**transport, "transport.options.peer": peer.address}
    runs: list[dict[str, Any]] = []
    described: dict[str, Any] = {}
    try:
        say(f"peer {peer.address}; storing {n_pages} pages through {profile!r}")
        with _pipeline(profile, overrides, geometry, tensor) as pipeline:
            start = time.perf_counter()
            stored = pipeline.set(keys, src_idx)
            store_s = time.perf_counter() - start
            if not all(stored):
                raise KVCRPolicyError(f"the peer stored {sum(stored)} of {n_pages} pages")
        verified = True
        for rep in range(repeat):
            for order in (("P", "Q"), ("Q", "P")):
                for side in order:
                    name = profile if side == "P" else vs
                    with _pipeline(name, overrides, geometry, tensor) as pipeline:
                        run = _restore(pipeline, keys, dst_idx, view, n_pages, expected)
                        described.setdefault(side, pipeline.transport.describe())
                    verified &= run["verified"]
                    runs.append(
                        {
                            "repeat": rep,
                            "side": side,
                            "profile": name,
                            "order": ",".join(order),
                            **run,
                        }
                    )
                    say(
                        f"{name}: restore {run['restore_gbps']:.2f} GB/s, limit "
                        f"{run['limit_gbps']:.2f} GB/s"
                    )
    finally:
        peer_exit = peer.stop()
    say("metadata: exists over stored keys on a second peer")
    meta_peer = PeerProcess({**transport, "placement.capacity_bytes": exists_keys * 16})
    meta = {**transport, "transport.options.peer": meta_peer.address}
    try:
        query = _exists_rate(profile, meta, exists_keys, max(3, repeat))
        query_vs = _exists_rate(vs, meta, exists_keys, max(3, repeat))
    finally:
        meta_exit = meta_peer.stop()

    def median(side: str, key: str, order: str | None = None) -> float:
        values = [r[key] for r in runs if r["side"] == side and order in (None, r["order"])]
        return statistics.median(values)

    restore, baseline = median("P", "restore_gbps"), median("Q", "restore_gbps")
    limit = statistics.median(r["limit_gbps"] for r in runs)
    ratio = statistics.median(r["restore_gbps"] / r["limit_gbps"] for r in runs if r["side"] == "P")
    return {
        "target": "ucx",
        "geometry": geometry_name,
        "layout": layout,
        "mla": mla,
        "tokens": tokens,
        "pages": n_pages,
        "bytes": nbytes,
        "repeat": repeat,
        "verified": verified,
        "limit_gbps": round(limit, 3),
        "restore_gbps": round(restore, 3),
        "baseline_gbps": round(baseline, 3),
        "ratio_to_limit": round(ratio, 3),
        "speedup_vs_baseline": round(restore / baseline, 3),
        "store_gbps": round(nbytes / store_s / 1e9, 3),
        "query_keys_per_s": round(query),
        "baseline_query_keys_per_s": round(query_vs),
        "transport_used": described.get("P", {}).get("transport_used"),
        "tls": tls,
        "orders": {
            order: {
                "restore_gbps": round(median("P", "restore_gbps", order), 3),
                "baseline_gbps": round(median("Q", "restore_gbps", order), 3),
            }
            for order in ("P,Q", "Q,P")
        },
        "profiles": {"P": profile, "Q": vs},
        "peer": {"address": peer.address, "exit_code": peer_exit, "meta_exit_code": meta_exit},
        "transport": described.get("P", {}),
        "runs": runs,
    }
