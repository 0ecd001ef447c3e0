"""The health state as a circuit breaker, against a real listening socket standing in for the
master's RPC port (no Mooncake needed): it opens on a failed call or a closed port, refuses
calls at once while open, and closes once the port, ``health_check()`` and a probe agree."""

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


def health(listener: socket.socket, check: Callable[[], int], probe: Callable[[], bool]) -> Any:
    from kvcr_policy_mooncake.health import Health

    return Health(listener.getsockname()[:2], check, probe, interval=0.05)


def test_a_trip_refuses_calls_at_once_until_the_probe_answers(port: socket.socket) -> None:
    answers = {"probe": False}
    breaker = health(port, lambda: 0, lambda: answers["probe"])
    try:
        assert breaker.allows()
        breaker.trip("a call returned -900 RPC_FAIL")
        start = time.perf_counter()
        assert not any(breaker.allows() for _ in range(1000))
        assert time.perf_counter() - start < 0.1
        snapshot = breaker.snapshot()
        assert snapshot["state"] == "open" and snapshot["refused_calls"] == 1000
        assert snapshot["reason"] == "a call returned -900 RPC_FAIL"
        time.sleep(0.2)
        assert breaker.is_open  # the port answers, the probe does not: still open
        answers["probe"] = True
        wait_until(lambda: not breaker.is_open, "the breaker closed", 5)
        assert breaker.allows() and breaker.snapshot()["last_outage_s"] > 0.2
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
        wait_until(lambda: not breaker.is_open, "the breaker closed", 5)
    finally:
        breaker.stop()


def test_a_master_gone_between_calls_is_noticed_without_a_call(port: socket.socket) -> None:
    breaker = health(port, lambda: 0, lambda: True)
    try:
        port.close()  # nothing listens there any more
        wait_until(lambda: breaker.is_open, "the breaker open", 5)
        assert "refused" in breaker.snapshot()["reason"]
    finally:
        breaker.stop()
