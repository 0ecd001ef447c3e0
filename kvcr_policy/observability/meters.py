"""Meters: the :class:`~kvcr_policy.observability.meter.PoolMeter` of each pool of one
pipeline, opened on first use; metrics that cannot be kept never stop the data path."""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry

from .labels import PoolLabels
from .meter import PoolMeter
from .metrics import families

__all__ = ["Meters", "open_meter"]

log = logging.getLogger("kvcr_policy.observability")


def open_meter(
    enabled: bool,
    backend: str,
    profile: str,
    pool: str,
    registry: CollectorRegistry | None = None,
) -> PoolMeter | None:
    """A meter for one pool, or None when metrics are off or cannot be kept.

    Metrics never stop the data path: a multiprocess folder that cannot be written (SGLang's
    ``PROMETHEUS_MULTIPROC_DIR`` removed under a running process) logs one warning instead.
    """
    if not enabled:
        return None
    try:
        return PoolMeter(families(registry), backend, profile, pool)
    except (OSError, ValueError) as err:
        log.warning("kvcr_policy metrics for pool %r are off: %s", pool, err)
        return None


class Meters:
    """The meters of one pipeline's pools, by pool name (labels ``backend`` and ``profile``
    fixed for the pipeline); every method is a no-op with metrics off."""

    def __init__(
        self, enabled: bool, backend: str, profile: str, registry: CollectorRegistry | None = None
    ) -> None:
        self.enabled = enabled
        self.backend = backend
        self.profile = profile
        self._registry = registry
        self._meters: dict[str, PoolMeter | None] = {}
        self._labels = PoolLabels("this pipeline")  # pool names as bounded label values

    def get(self, pool: str) -> PoolMeter | None:
        """The meter of a pool opened before, else None."""
        return self._meters.get(pool)

    def open(self, pool: str) -> PoolMeter | None:
        """The meter of ``pool``, made on first use (callers pass only registered or refused
        pools: an arbitrary name must not become a label)."""
        if pool not in self._meters:
            label = self._labels.label(pool) if self.enabled else pool
            self._meters[pool] = open_meter(
                self.enabled, self.backend, self.profile, label, self._registry
            )
        return self._meters[pool]

    def close(self) -> None:
        """Take back every level (the tiers are gone)."""
        for meter in self._meters.values():
            if meter is not None:
                meter.close()
