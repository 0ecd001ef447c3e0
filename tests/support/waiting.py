"""Waiting for evidence: poll a condition until it holds, and fail saying what never happened.

A test that needs something to have happened (a server up, a claim outstanding, a tier settled)
polls for it here instead of sleeping a guessed time: it goes on as soon as the evidence is
there, and a failure names what was awaited, for how long, and the last value seen.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import pytest

__all__ = ["wait_until"]

T = TypeVar("T")


def wait_until(
    condition: Callable[[], T],
    what: str,
    seconds: float,
    *,
    every: float = 0.01,
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """Call ``condition`` every ``every`` seconds until it returns something truthy, and return
    that; fail the test after ``seconds`` naming ``what``. Exceptions of the ``ignore`` types
    count as "not yet" (a server still starting refuses connections)."""
    deadline = time.monotonic() + seconds
    last: object = None
    while True:
        try:
            last = condition()
        except ignore as err:
            last = err
        else:
            if last:
                return last  # type: ignore[return-value]
        if time.monotonic() >= deadline:
            pytest.fail(f"{what}: not seen within {seconds:g} s (last: {last!r})")
        time.sleep(every)
