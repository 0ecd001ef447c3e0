"""Starting one KVCR runner from the pipeline's configuration, and what a failed start leaves.

KVCR gets: the pool buffer (or a staged pool's staging area, :mod:`.staging`) as its framework
registration, the placed region as its local DRAM pool (``LocalDramOptions``), KVCR's own LRU or
FIFO policy (``eviction.strategy``; the G3 variants with a G3 tier) wrapped so that forgotten
keys go first, ``transport.op_timeout_s`` as its operation timeout (twice that to abandon), its
telemetry into running totals, and its NIXL agent built with the configured progress-thread
setting.

A start that fails raises ``KVCRStartupError`` whenever KVCR's close raised, and KVCR then keeps
the core, because native work may still touch the memory it registered. Its own quiescence check
on that core (:func:`stopped`) tells whether the region may be freed (:class:`StartFailed`) or
must stay mapped (:class:`Retained`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvcr.api import KVCR, KVCRBindings
from kvcr.config import G3Options, KVCRBackendConfigs, KVCRConfig, LocalDramOptions
from kvcr.types import KVCRStartupError, PinRequestId, RegionDescriptor

from kvcr_policy.plugin_api import Region

from . import agent
from .layout import PageLayout
from .policy import POLICIES, TierPolicy
from .runner import Runner
from .telemetry import Interval, Totals

__all__ = ["Retained", "StartFailed", "Started", "start_runner", "stopped"]


class StartFailed(Exception):
    """KVCR failed to start and holds nothing native (the cause says why)."""


class Retained(Exception):
    """KVCR failed to start and kept native resources: never free what it registered."""

    @staticmethod
    def refuse() -> None:
        """A ``wait`` for ``Region.close`` that keeps the region mapped."""
        raise RuntimeError("KVCR failed to start without reaching quiescence")


@dataclass(frozen=True, slots=True)
class Started:
    runner: Runner
    policy: TierPolicy
    port: tuple[int, str]


# Pins are how KVCR reaches a framework's own G2 memory on other hosts (remote G2); a local
# tier never asks (checked with kvcr 0.1.1), but KVCRBindings requires the three callables.
def _request_pin(keys: Any) -> PinRequestId:
    return PinRequestId(0)


def _poll_pin_results() -> list[Any]:
    return []


def _release_pin(handle: Any) -> bool:
    return False


def start_runner(
    layout: PageLayout,
    framework: RegionDescriptor,
    region: Region,
    g3: G3Options | None,
    port: tuple[int, str],
    *,
    eviction: str,
    op_timeout_s: float,
    progress_thread: bool,
    poll_interval_s: float,
) -> Started:
    """Start KVCR for one pool; raise :class:`StartFailed` or :class:`Retained` if it fails."""
    inner, inner_g3 = POLICIES[eviction]
    policy = TierPolicy(inner_g3() if g3 is not None else inner())
    timeout_ms = max(1, round(op_timeout_s * 1000))
    config = KVCRConfig(
        nixl_agent_name=layout.agent,
        pool_layouts=[(layout.pool, layout.element_bytes)],
        enable_telemetry=True,
        operation_timeout_ms=timeout_ms,
        abandon_timeout_ms=2 * timeout_ms,
        nixl_listen_port=port[0],
    )
    bindings = KVCRBindings(
        request_pin=_request_pin,
        poll_pin_results=_poll_pin_results,
        release_pin=_release_pin,
        stats_factory=Interval,
        policy=policy,
    )
    backends = KVCRBackendConfigs(
        framework_regions=[framework],
        local_dram=LocalDramOptions(pools=[(layout.pool, region.address, region.size)]),
        g3=g3,
    )
    try:
        with agent.starting(layout.agent, progress_thread):
            kvcr = KVCR(config, bindings, backends)
    except Exception as err:
        if not stopped(err, layout.agent):
            raise Retained(str(err)) from err
        raise StartFailed(str(err)) from err
    runner = Runner(kvcr, layout.agent, poll_interval_s, 2 * timeout_ms / 1000, Totals())
    return Started(runner, policy, port)


def stopped(err: BaseException, agent_name: str) -> bool:
    """Whether a KVCR that failed to start holds nothing native any more.

    KVCR keeps the core of a ``KVCRStartupError`` in a list of its own
    (``kvcr.api._NONQUIESCENT_STARTUP_RESOURCES``, 0.1.1), also when the start failed in its
    progress thread (a listener that cannot bind), which releases every registration before it
    ends. KVCR's own quiescence check on that core decides; anything unknown counts as not
    stopped, and the region then stays mapped.
    """
    if not isinstance(err, KVCRStartupError):
        return True
    try:
        from kvcr import api

        for core, _ in api._NONQUIESCENT_STARTUP_RESOURCES:
            if core.config.nixl_agent_name == agent_name:
                return bool(core.is_quiescent())
    except Exception:
        return False
    return False
