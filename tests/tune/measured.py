"""Hand-made bench results for the tune tests: known rates, no measurement."""

from __future__ import annotations

from collections.abc import Sequence

from kvcr_policy.bench import BenchResult, Run


def result(
    pairs: dict[str, Sequence[tuple[float, float]]],
    *,
    limit: float = 10.0,
    verified: bool = True,
) -> BenchResult:
    """A confirmation whose runs restore at the given (P, Q) GB/s, per order and repeat."""
    runs = []
    for order, rates in pairs.items():
        first = "P" if order == "P,Q" else "Q"
        for rep, (p, q) in enumerate(rates):
            sides = [("P", p), ("Q", q)] if first == "P" else [("Q", q), ("P", p)]
            for side, gbps in sides:
                runs.append(Run(rep, order, "x", side, gbps, limit, verified))
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
    )
