"""Hand-made bench results for the tune tests: known rates, no measurement.

:func:`install` replaces the bench's runner, for tune's search and its confirmation alike, with
a :class:`FakeBench` that reads each side's profile and answers the rates a test chooses, on a
fake clock: what is tested is tune's own logic (search, confirm, write, check), never a
measurement of the moment.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

from kvcr_policy import load_config
from kvcr_policy.bench import BenchResult, BenchSetup, Run
from kvcr_policy.tune import run as tune_run
from kvcr_policy.tune import search as tune_search

#: ``rate(config, order)``: the restore rate (GB/s) a side with ``config`` gets in ``order``.
Rate = Callable[[Any, str], float]


def result(
    pairs: dict[str, Sequence[tuple[float, float]]],
    *,
    limit: float = 10.0,
    verified: bool = True,
    host_copy: float = 20.0,
) -> BenchResult:
    """A confirmation whose runs restore at the given (P, Q) GB/s, per order and repeat, each
    beside a limit of ``limit`` and a host memory copy of ``host_copy`` GB/s."""
    runs = []
    for order, rates in pairs.items():
        first = "P" if order == "P,Q" else "Q"
        for rep, (p, q) in enumerate(rates):
            sides = [("P", p), ("Q", q)] if first == "P" else [("Q", q), ("P", p)]
            for side, gbps in sides:
                runs.append(Run(rep, order, "x", side, gbps, limit, verified, host_copy))
    return BenchResult(
        target="cpu",
        backend="dram",
        geometry="small",
        layout="layer_first",
        mla=False,
        tokens=256,
        pages=16,
        page_bytes=1 << 19,
        nbytes=8 << 20,
        scatter=False,
        repeat=max(len(r) for r in pairs.values()),
        baseline="Q",
        runs=tuple(runs),
        limit="test",
        profiles={"P": {"name": "tuned", "path": None}, "Q": {"name": "base", "path": None}},
        store_gbps={"P": 1.0, "Q": 1.0},
        store_host_copy_gbps={"P": host_copy, "Q": host_copy},
        limit_short="one test copy",
    )


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeBench:
    """Each call takes ``seconds`` of the fake clock and restores at ``rate(config, order)``."""

    def __init__(
        self, clock: Clock, rate: Rate, seconds: float = 10.0, jitter: float = 0.001
    ) -> None:
        self.clock, self.rate, self.seconds, self.jitter = clock, rate, seconds, jitter
        self.calls: list[BenchSetup] = []

    def __call__(self, setup: BenchSetup, say: Any = None) -> BenchResult:
        self.calls.append(setup)
        self.clock.now += self.seconds
        p = load_config(profile=setup.profile, dotenv=False).config
        q = load_config(profile=setup.vs, dotenv=False).config
        pairs = {}
        for order in ("P,Q", "Q,P"):
            jitter = [1.0 + self.jitter * (i % 3 - 1) for i in range(setup.repeat)]
            pairs[order] = [(self.rate(p, order) * j, self.rate(q, order)) for j in jitter]
        return result(pairs)


def install(
    monkeypatch: pytest.MonkeyPatch, rate: Rate, seconds: float = 10.0, jitter: float = 0.001
) -> FakeBench:
    """Measure with a :class:`FakeBench` of ``rate``; ``jitter`` spreads P's repeats (they cycle
    through ``1 - jitter``, ``1`` and ``1 + jitter`` times its rate)."""
    clock = Clock()
    fake = FakeBench(clock, rate, seconds, jitter)
    monkeypatch.setattr(tune_search, "run_bench", fake)
    monkeypatch.setattr(tune_run, "run_bench", fake)
    return fake
