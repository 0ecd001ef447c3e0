"""Rate-limited warnings: the first of a kind at once, then one line per interval with the
count of those left out (a clock injected: no sleeping, no timing)."""

from __future__ import annotations

import logging

import pytest

from kvcr_policy.observability import repeats
from kvcr_policy.observability.repeats import Repeats


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_first_then_a_count_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    limited = Repeats(logging.getLogger("kvcr_policy.test.repeats"), 10.0, clock)
    with caplog.at_level(logging.WARNING, "kvcr_policy.test.repeats"):
        for i in range(35):
            clock.now += 0.5  # 35 failures in 17.5 s, as a peer that is down gives them
            limited.warning("peer a", "peer %s down (call %d)", "a", i)
        limited.warning("peer b", "peer %s down", "b")  # another kind is not held back
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "peer a down (call 0)",
        "peer a down (call 20) (19 more like this in the last 10 s)",
        "peer b down",
    ]


def test_the_kinds_remembered_stay_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(repeats, "MAX_KINDS", 8)
    limited = Repeats(logging.getLogger("kvcr_policy.test.repeats"), 10.0, Clock())
    for i in range(1000):
        limited.warning(f"kind {i}", "x")
    assert len(limited._kinds) == 8
