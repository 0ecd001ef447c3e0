"""The ``mooncake`` backend of ``kvcr-policy bench`` (registered by this plugin's hook)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, ClassVar

from kvcr_policy.plugin_api import BenchBackend, BenchError, BenchSetup, Pipeline, PoolGeometry

from .client import quiet_logs

__all__ = ["MOONCAKE_INSTALL", "MooncakeBench"]


MOONCAKE_INSTALL = (
    "bash .ci/install-mooncake.sh and pip install -e plugins/kvcr-policy-mooncake (from the "
    "kvcr_policy source tree)"
)


class MooncakeBench(BenchBackend):
    """Mooncake Store: per side a ``mooncake_master`` on free loopback ports and one segment
    process that holds the pages; the pipelines contribute no segment, so every restore reads
    another process's segment over tcp. The limit is one ``batch_get_into`` of the same bytes,
    as page-sized objects in the same segment, into contiguous pool memory
    (``Pipeline.probe``, on a client of its own: :mod:`.probe` says why), after an untimed
    first probe stored them."""

    name = "mooncake"
    # mooncake.store itself is checked by importing it (find_spec would import its package).
    needs: ClassVar[Mapping[str, str]] = {"kvcr_policy_mooncake": MOONCAKE_INSTALL}
    limit_text = (
        "one batch_get_into of the same bytes (page-sized objects) from the same segment into "
        "contiguous pool memory (Pipeline.probe), on a client of its own"
    )
    limit_short = "one batch_get_into"
    #: The segment's size in copies of the run's pages: it holds P's pages, the peer's (with
    #: --peer) and the probe's, and the master starts evicting at 90 % full.
    copies = 4

    def __init__(self, setup: BenchSetup) -> None:
        super().__init__(setup)
        self.instances: dict[str, dict[str, Any]] = {}
        self._probed: set[tuple[int, int]] = set()

    def check(self) -> None:
        super().check()
        quiet_logs(self._native_logs())
        try:
            import mooncake.store  # noqa: F401  (libibverbs.so.1 is found only on import)
        except ImportError as err:
            raise BenchError(f"backend 'mooncake' cannot import mooncake ({err}): "
                             f"{MOONCAKE_INSTALL}") from err  # fmt: skip

    def _native_logs(self) -> bool:
        """``observability.native_logs`` of the run's profile and --set (false if it does not
        load: the run then stops on that with its own message)."""
        from kvcr_policy import load_config

        try:
            loaded = load_config(profile=self.setup.profile, overrides=self.setup.overrides)
        except Exception:
            return False
        return bool(loaded.config.observability.native_logs)

    def planned(self) -> dict[str, Any]:
        return {"backend.name": "mooncake", "backend.options.master": "127.0.0.1:1"}

    @contextmanager
    def start(self, label: str, profile: str, geometry: PoolGeometry) -> Iterator[dict[str, Any]]:
        from .master import MasterProcess
        from .segment import SegmentProcess

        with MasterProcess() as master:
            size = max(64 << 20, self.copies * geometry.nbytes + (64 << 20))
            holder = SegmentProcess(master.address, size, prefault=True)
            try:
                yield {
                    "backend.name": "mooncake",
                    "backend.options.master": master.address,
                    "backend.options.segment_bytes": 0,
                }
            finally:
                self.instances[label] = {
                    "master": master.address,
                    "segment": holder.segment,
                    "segment_bytes": size,
                    "prefaulted_bytes": holder.info.get("prefaulted_bytes"),
                    "prefault_s": holder.info.get("prefault_s"),
                    "segment_exit_code": holder.stop(),
                }

    def limit_gbps(self, pipeline: Pipeline, nbytes: int) -> float:
        key = (id(pipeline), nbytes)
        if key not in self._probed:  # the first probe stores the object it reads
            pipeline.probe(nbytes)
            self._probed.add(key)
        return super().limit_gbps(pipeline, nbytes)

    def describe(self, transport: Mapping[str, Any]) -> dict[str, Any]:
        return {"mooncake": dict(self.instances), "threads": transport.get("threads")}
