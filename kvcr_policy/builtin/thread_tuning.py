"""Built-in thread tuning: ``sys.setswitchinterval`` while a pipeline is open."""

from __future__ import annotations

import logging
import sys

from ..config.schema import ThreadTuningSection
from ..hookspecs import hookimpl
from ..registry import NoOptions, RegisterStrategy

__all__ = ["SwitchInterval"]

log = logging.getLogger("kvcr_policy.thread_tuning")


class SwitchInterval:
    """Sets the switch interval on open, restores the previous value on close.

    With ``switch_interval_s`` unset (the default) nothing is touched. A busy Python thread
    holding the GIL delays UCX progress and copy threads; a shorter interval hands the GIL over
    sooner (measured: 4-7x lower round-trip latency at 0.0005 s).
    """

    def __init__(self, section: ThreadTuningSection, options: NoOptions) -> None:
        self.interval = section.switch_interval_s
        self._previous: float | None = None

    def apply(self) -> None:
        if self.interval is None or self._previous is not None:
            return
        self._previous = sys.getswitchinterval()
        sys.setswitchinterval(self.interval)
        log.info("switch interval %.6f s -> %.6f s", self._previous, self.interval)

    def restore(self) -> None:
        if self._previous is None or self.interval is None:
            return
        current = sys.getswitchinterval()
        previous, self._previous = self._previous, None
        # Someone else changed it after us: theirs is newer, so leave it.
        if abs(current - self.interval) > 1e-9:
            log.info("switch interval changed to %.6f s elsewhere; not restoring", current)
            return
        sys.setswitchinterval(previous)
        log.info("switch interval %.6f s -> %.6f s (restored)", current, previous)


@hookimpl
def kvcr_register_strategies(register: RegisterStrategy) -> None:
    register("thread_tuning", "switch_interval", SwitchInterval)
