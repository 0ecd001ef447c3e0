"""The ``file`` backend's benchmark adapter (registered by :mod:`.hooks`).

Each side gets a tenant of its own under ``backend.options.path`` (``bench-P``,
``bench-Q``, ...; its folder removed afterwards), its slot file sized for the run's pages.
The limit is the tier's own probe: one sequential read of the same bytes from the start of
the side's slot file, with direct I/O where the tier uses it, into a page-aligned buffer
(:meth:`.tier.FileTier.probe`): what the file system gives one reader of the same bytes,
measured in the same run.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kvcr_policy.bench_adapter import BenchBackend, BenchSetup, Pipeline
from kvcr_policy.errors import BenchError
from kvcr_policy.geometry import PoolGeometry

__all__ = ["FileBench"]


class FileBench(BenchBackend):
    """Slot files in a fresh folder per side under ``--set backend.options.path=DIR``."""

    name = "file"
    limit_text = (
        "one sequential read of the same bytes from the slot file, direct I/O where the tier "
        "uses it, same file system"
    )
    limit_short = "one direct sequential read"

    def __init__(self, setup: BenchSetup) -> None:
        super().__init__(setup)
        path = (setup.overrides or {}).get("backend.options.path")
        if path is None:
            message = (
                "--backend file needs a folder on the file system to measure: "
                "--set backend.options.path=DIR"
            )
            raise BenchError(message)
        self.root = Path(str(path))
        self._warm: set[int] = set()

    def check(self) -> None:
        super().check()
        if not self.root.is_dir():
            raise BenchError(f"--set backend.options.path: {str(self.root)!r} is not a folder")

    def planned(self) -> dict[str, Any]:
        return {"backend.name": "file"}

    @contextmanager
    def start(self, label: str, profile: str, geometry: PoolGeometry) -> Iterator[dict[str, Any]]:
        tenant = "bench-" + "-".join(label.split())
        folder = self.root / tenant
        shutil.rmtree(folder, ignore_errors=True)  # a run killed before it cleaned up
        try:
            yield {
                "backend.name": "file",
                "backend.options.tenant": tenant,
                "backend.options.capacity_bytes": geometry.nbytes,
                "backend.options.min_free_bytes": 0,
            }
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def limit_gbps(self, pipeline: Pipeline, nbytes: int) -> float:
        if id(pipeline) not in self._warm:  # the tier's probe buffer faulted in, untimed
            pipeline.probe(nbytes)
            self._warm.add(id(pipeline))
        start = time.perf_counter()
        pipeline.probe(nbytes)
        return nbytes / (time.perf_counter() - start) / 1e9
