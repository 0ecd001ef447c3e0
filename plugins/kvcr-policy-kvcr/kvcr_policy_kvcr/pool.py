"""KvcrPool: one pipeline pool on its own KVCR runner; the ``PoolTier`` of ``kvcr``.

The mover drives it like any backend: ``contains`` is one KVCR ``query`` per metadata-query
batch, and each get or set is a :class:`~kvcr_policy_kvcr.transfer.KvcrTransfer`. ``delete``
and ``clear`` make keys unreachable at once (KVCR 0.1.1 cannot remove a block; see
:mod:`~kvcr_policy_kvcr.keys`); ``probe`` is one NIXL transfer, the limit a restore is measured
against; ``close`` frees the region only once KVCR has stopped. A staged pool (:mod:`.staging`)
moves its batches on threads of its own (``stager``), one KVCR call per part of a batch.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any

import numpy as np

from kvcr_policy.plugin_api import ClosedError, Endpoint, IndicesError, Region, TransportError

from .agent import ProbeAgent
from .keys import KeySpace
from .layout import PageLayout
from .policy import TierPolicy
from .runner import Runner
from .staging import Staging
from .transfer import LOCAL, PRESENT, KvcrRead, KvcrWrite

__all__ = ["KvcrPool", "kept"]

log = logging.getLogger("kvcr_policy_kvcr.pool")

#: Staging areas of pools whose KVCR never reached quiescence: KVCR may still touch them.
kept: list[Staging] = []


class KvcrPool:
    """See the module docstring; made by :meth:`KvcrBackend.attach`."""

    def __init__(
        self,
        endpoint: Endpoint,
        layout: PageLayout,
        region: Region,
        runner: Runner,
        policy: TierPolicy,
        query_batch: int,
        progress_thread: bool,
        staging: Staging | None = None,
        threads: int = 1,
    ) -> None:
        self.name = layout.geometry.name
        self.layout = layout
        self.geometry = layout.geometry
        self.region = region
        self.runner = runner
        self.policy = policy
        self.staging = staging
        self.stager: Executor | None = None
        if staging is not None:
            self.stager = ThreadPoolExecutor(threads, thread_name_prefix="kvcr-staging")
        self.keys = KeySpace(staged=staging is not None)
        self.policy.live_prefix = self.keys.live_prefix
        self.endpoint = endpoint
        self._query_batch = query_batch
        self._progress_thread = progress_thread
        self._probe: ProbeAgent | None = None
        self._lock = threading.Lock()

    # ---- metadata -------------------------------------------------------------------------

    def contains(self, keys: Sequence[str]) -> int:
        statuses = self.runner.query(self.keys.block_keys(keys))
        for i, status in enumerate(statuses):
            if status not in PRESENT:
                return i
        return len(statuses)

    def read(self, keys: list[str], pages: np.ndarray) -> KvcrRead:
        return KvcrRead(self, keys, pages)

    def write(self, keys: list[str], pages: np.ndarray) -> KvcrWrite:
        return KvcrWrite(self, keys, pages)

    def delete(self, keys: Sequence[str]) -> int:
        """Forget the present ``keys``: later lookups miss them, and KVCR evicts their blocks
        before any live one (see :mod:`~kvcr_policy_kvcr.policy`)."""
        keys = list(dict.fromkeys(keys))
        blocks = self.keys.block_keys(keys)
        statuses = self.runner.query(blocks)
        rows = zip(keys, blocks, statuses, strict=True)
        present = [(k, b, s) for k, b, s in rows if s in PRESENT]
        if not present:
            return 0
        self.keys.forget([key for key, _, _ in present])
        self.policy.mark_dead([block for _, block, _ in present])
        # A claim and its release make KVCR score each block in DRAM again, now as dead (a
        # fetch of a block in G3 would copy it back into DRAM: those wait for G3's eviction).
        local = [b for _, b, s in present if s == LOCAL]
        if local:
            labels = self.layout.labels
            entries = self.runner.start("fetch", self.runner.kvcr.fetch, local, None, labels)
            handles = [e.release_handle for e in entries.result().values() if e.release_handle]
            self.runner.hold(handles)
            self.runner.release(handles)
        return len(present)

    def clear(self) -> None:
        """Forget every key: a new key epoch; the old blocks are evicted first."""
        self.keys.clear()
        self.policy.live_prefix = self.keys.live_prefix

    # ---- limits and reports ---------------------------------------------------------------

    def probe(self, nbytes: int) -> None:
        """One NIXL transfer of ``nbytes`` from KVCR's DRAM region into the pool's first bytes,
        by an agent built like KVCR's (the limit a restore is measured against)."""
        room = min(self.region.size, self.endpoint.nbytes)
        if nbytes > room:
            message = (
                f"pool {self.name!r}: probe of {nbytes} bytes does not fit (KVCR region "
                f"{self.region.size} bytes, pool {self.endpoint.nbytes} bytes); probe at most "
                f"{room}"
            )
            raise IndicesError(message)
        with self._lock:
            if self.runner.state != "open":
                raise ClosedError(f"pool {self.name!r} is closed: probe() refused")
            if self._probe is None:
                self._probe = ProbeAgent(
                    f"{self.layout.agent}-probe",
                    self._progress_thread,
                    (self.region.address, self.region.size),
                    (self.endpoint.address, self.endpoint.nbytes),
                )
            self._probe.move(nbytes, self.runner.abandon_s)

    def stats(self) -> dict[str, Any]:
        return {
            "page_bytes": self.geometry.page_bytes,
            "slots": self.region.size // self.geometry.page_bytes,
            "agent": self.layout.agent,
            "dead_blocks": self.policy.dead(),
            "runner": self.runner.stats(),
            "staging": None if self.staging is None else self.staging.describe(),
        }

    def audit(self) -> dict[str, Any] | None:
        return self.region.audit().to_dict()

    def close(self) -> None:
        """Wait for KVCR's operations, release claims, close KVCR, and only then free the
        region (kept mapped, and reported leaked, if KVCR could not reach quiescence)."""
        quiescent = self.runner.close()
        if self.stager is not None:  # its calls have all ended with the runner's
            self.stager.shutdown(wait=True)
            if not quiescent and self.staging is not None:
                kept.append(self.staging)
        with self._lock:
            if self._probe is not None:
                self._probe.close()
                self._probe = None
        self.endpoint = Endpoint(0, 0)  # the pool's buffer may go now
        if quiescent:
            self.region.close()
            return

        def unsafe() -> None:
            raise TransportError("KVCR did not reach quiescence at close")

        try:
            self.region.close(wait=unsafe)
        except TransportError as err:
            log.error("pool %r: KVCR region kept mapped (leaked): %s", self.name, err)
