"""The memory pre-flight of a loaded configuration, for the commands that check one before a
launch (``validate``, ``sglang-config --check``).

They ask whether one tier of ``placement.capacity_bytes`` could fit this host (or its memory
cgroup) at all, where the configured backend maps its tiers in the process that loads the
configuration (:meth:`~kvcr_policy.registry.Registry.maps_tiers`); a peer's client does not,
its ``serve`` checks its own at start. The rule and the message are
:mod:`kvcr_policy.memory.preflight`'s.
"""

from __future__ import annotations

from ..memory.headroom import Binding
from ..memory.preflight import SETTING, check_placement
from ..plugins import make_plugin_manager
from .loading import LoadedConfig

__all__ = ["check_host_fit"]


def check_host_fit(loaded: LoadedConfig) -> Binding | None:
    """Raise :class:`~kvcr_policy.errors.TierMemoryError` when one tier of ``loaded`` is more
    than this host holds; the binding limit, or None where none applies or none was read."""
    registry = loaded.registry or make_plugin_manager(loaded.config).registry
    if not registry.maps_tiers(loaded.config):
        return None
    placement, origin = loaded.config.placement, loaded.origin(SETTING)
    written = loaded.written.get(SETTING)  # 64GB (59.6 GiB) in the message: as written
    return check_placement(placement, origin, what="each pool's tier", host=True, written=written)
