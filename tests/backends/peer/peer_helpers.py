"""Helpers of the peer tests: small pools, their pages, fresh keys, the server and its settings."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Mapping, Sequence

import numpy as np

from kvcr_policy.geometry import PoolGeometry
from tests.support.installs import missing

SERVER_SETS = {
    "transport.name": "ucx",
    "transport.op_timeout_s": 10,
    "placement.capacity_bytes": "256MiB",
    "transport.options.heartbeat_s": 0.5,
}


def need_ucxx() -> None:
    try:
        import ucxx  # noqa: F401
    except Exception as err:  # ImportError, or a broken native library
        missing(f"ucxx cannot be imported ({err}); pip install 'kvcr-policy[ucx]'")


def geometry(
    layout: str = "layer_first", *, pages: int = 8, mla: bool = False, name: str = "kv"
) -> PoolGeometry:
    return PoolGeometry(
        name=name,
        layout=layout,
        layers=3,
        heads=1 if mla else 2,
        head_dim=16,  # type: ignore[arg-type]
        dtype="float16",
        page_size=4,
        tokens=4 * pages,
        mla=mla,
    )


def pool_buffer(geo: PoolGeometry, seed: int = 0) -> np.ndarray:
    buffer = np.empty(geo.shape, dtype=np.float16)
    raw = buffer.view(np.uint8).reshape(-1)
    raw[:] = np.random.default_rng(seed).integers(0, 256, raw.size, dtype=np.uint8)
    return buffer


def pages_of(buffer: np.ndarray, geo: PoolGeometry) -> np.ndarray:
    """(planes, pages, fragment bytes) byte view: page p is [:, p]."""
    return buffer.view(np.uint8).reshape(geo.fragments_per_page, geo.pages, geo.fragment_bytes)


def token_indices(geo: PoolGeometry, pages: range | np.ndarray) -> np.ndarray:
    pages = np.asarray(pages, dtype=np.int64)
    return (pages[:, None] * geo.page_size + np.arange(geo.page_size)).reshape(-1)


def new_keys(n: int) -> list[str]:
    salt = uuid.uuid4().hex[:8]
    return [f"{salt}-{i}" for i in range(n)]


class Serve:
    """``kvcr-policy serve`` as a child process, driven only through its command line: the one
    JSON line it prints on start, its log on stderr, and SIGTERM."""

    def __init__(
        self,
        sets: Mapping[str, object],
        *,
        listen: str | None = "127.0.0.1:0",
        args: Sequence[str] = (),
        python: Sequence[str] = ("-m", "kvcr_policy"),
        timeout: float = 60.0,
    ) -> None:
        command = [sys.executable, *python, "serve", *args]
        if listen is not None:
            command += ["--listen", listen]
        for key, value in sets.items():
            command += ["--set", f"{key}={value}"]
        self.proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.log: list[str] = []
        self._drainer = threading.Thread(target=self._drain, daemon=True)
        self._drainer.start()
        lines: list[str] = []
        reader = threading.Thread(
            target=lambda: lines.append(self.proc.stdout.readline()),  # type: ignore[union-attr]
            daemon=True,
        )
        reader.start()
        reader.join(timeout)
        if not lines or not lines[0]:
            self.proc.kill()
            self.proc.wait()
            tail = "\n".join(self.log[-20:])
            raise AssertionError(f"kvcr-policy serve printed no line within {timeout} s:\n{tail}")
        self.info: dict[str, object] = json.loads(lines[0])
        self.address = str(self.info["listening"])
        self.port = int(self.address.rsplit(":", 1)[1])

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line.rstrip())

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM, then the exit code (SIGKILL if it overstays ``timeout``)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self._drainer.join(10)
        return code
