"""The health state as a circuit breaker, against a real listening socket standing in for the
master's RPC port (no Mooncake needed): it opens on a failed call or a closed port, refuses
calls at once while open, and closes once the port, ``health_check()`` and a probe agree.

Nothing is slept into: a state is asserted once the watcher has been seen checking (its probe
called), and every wait is bounded by the breaker's own interval (``recheck_s``): one interval
asleep, a connect that may take another, and one more for a busy host."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from importlib import metadata
from typing import Any

import pytest

from tests.plugins.mooncake.mooncake_helpers import PLUGIN_DIST
from tests.support.installs import missing
from tests.support.waiting import wait_until


@pytest.fixture
def port() -> Iterator[socket.socket]:
    try:
        metadata.distribution(PLUGIN_DIST)
    except metadata.PackageNotFoundError:
        missing(f"{PLUGIN_DIST} is not installed; pip install -e plugins/kvcr-policy-mooncake")
    listener = socket.create_server(("127.0.0.1", 0))
    yield listener
    listener.close()


INTERVAL_S = 0.5  # the watcher's period (the backend's recheck_s) in these tests


def health(listener: socket.socket, check: Callable[[], int], probe: Callable[[], bool]) -> Any:
    from kvcr_policy_mooncake.health import Health

    return Health(listener.getsockname()[:2], check, probe, interval=INTERVAL_S)


def within(breaker: Any) -> float:
    """How long the watcher may take to notice a change (its README: within ``recheck_s``)."""
    return 3 * breaker.interval


def test_a_trip_refuses_calls_at_once_until_the_probe_answers(port: socket.socket) -> None:
    checks: list[float] = []
    probes: list[float] = []
    answers = {"probe": False}

    def check() -> int:
        checks.append(time.monotonic())
        return 0

    def probe() -> bool:
        probes.append(time.monotonic())
        return answers["probe"]

    breaker = health(port, check, probe)
    try:
        assert breaker.allows()
        breaker.trip("a call returned -900 RPC_FAIL")
        tripped = time.monotonic()
        before = len(checks)
        assert not any(breaker.allows() for _ in range(1000))
        assert len(checks) == before  # at once: no call reaches the master while open
        snapshot = breaker.snapshot()
        assert snapshot["state"] == "open" and snapshot["refused_calls"] == 1000
        assert snapshot["reason"] == "a call returned -900 RPC_FAIL"
        # The port answers, the probe does not: still open after the watcher probed twice.
        wait_until(lambda: len(probes) >= 2, "the watcher probing the master", 2 * within(breaker))
        assert breaker.is_open
        answers["probe"] = True
        wait_until(lambda: not breaker.is_open, "the breaker closed", within(breaker))
        assert breaker.allows() and breaker.snapshot()["last_outage_s"] >= probes[1] - tripped
        breaker.trip("again")
        assert breaker.snapshot()["trips"] == 2
    finally:
        breaker.stop()


def test_a_bad_health_check_opens_it(port: socket.socket) -> None:
    code = {"value": 2}
    breaker = health(port, lambda: code["value"], lambda: True)
    try:
        assert not breaker.allows()
        assert breaker.snapshot()["reason"] == "health_check() = 2"
        code["value"] = 0
        wait_until(lambda: not breaker.is_open, "the breaker closed", within(breaker))
    finally:
        breaker.stop()


def test_a_master_gone_between_calls_is_noticed_without_a_call(port: socket.socket) -> None:
    breaker = health(port, lambda: 0, lambda: True)
    try:
        port.close()  # nothing listens there any more
        wait_until(lambda: breaker.is_open, "the breaker open", within(breaker))
        assert "refused" in breaker.snapshot()["reason"]
    finally:
        breaker.stop()
