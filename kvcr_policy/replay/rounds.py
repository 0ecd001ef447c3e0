"""The runs of a replay, in rounds: every arm (no tier, the ``--vs`` profile, ``--profile``)
once a round, in an order that rotates from round to round (and reverses every other cycle),
so that no arm always runs first, last or after the same neighbour on a machine whose load
drifts. An engine (:class:`EngineRuns`) runs one arm; this module owns the order, the replay's
own tier around each run (:mod:`.tier`) and the medians over the rounds."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any, Protocol

from .figures import compare, compare_no_tier
from .setup import ReplaySetup, labelled_runs
from .tier import run_tier

__all__ = ["EngineRuns", "orders", "paired_ratio", "run_rounds", "summarize_rounds"]


class EngineRuns(Protocol):
    """One engine's side of a replay: its tier's capacity and one run's figures."""

    capacity: int

    def run(self, label: str, profile: str | None, tier: dict[str, Any]) -> dict[str, Any]:
        """One run of the prompts with ``profile`` (None: no L3 tier), its tier pointed at by
        ``tier`` (overrides); its figures, with ``outputs``."""
        ...


def orders(arms: Sequence[str], rounds: int) -> list[list[str]]:
    """The arms' order in each round: rotated by one each round, reversed every other cycle."""
    k = len(arms)
    chosen = []
    for n in range(rounds):
        turned = list(arms[n % k :]) + list(arms[: n % k])
        chosen.append(turned[::-1] if (n // k) % 2 else turned)
    return chosen


def run_rounds(setup: ReplaySetup, engine: EngineRuns) -> list[dict[str, dict[str, Any]]]:
    """``setup.repeat`` rounds of every arm; per round ``{label: figures}`` (with ``order``,
    the position the run had in its round)."""
    profiles = dict(labelled_runs(setup))
    rounds = []
    for order in orders(list(profiles), setup.repeat):
        runs: dict[str, dict[str, Any]] = {}
        for position, label in enumerate(order):
            with run_tier(setup, profiles[label], engine.capacity) as tier:
                runs[label] = dict(engine.run(label, profiles[label], tier), order=position)
        rounds.append({label: runs[label] for label in profiles})
    return rounds


def _head(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One round's headline: the tier against the baseline (and no tier, with ``--vs``), the
    tier's TTFT over the better of the others in the same round (``*_vs_best``), and the
    same request by request (``ttft_paired_vs_best``, :func:`paired_ratio`)."""
    head = compare(runs["baseline"], runs["tier"])
    if "no_tier" in runs:
        head.update(compare_no_tier(runs["no_tier"]))
    for name in ("ttft_p50", "ttft_p90"):
        others = [head.get(f"{arm}_{name}_s") for arm in ("baseline", "no_tier")]
        best = min((v for v in others if v is not None), default=None)
        mine = head[f"{name}_s"]
        head[f"{name}_vs_best"] = None if not best or mine is None else round(mine / best, 4)
    arms = [arm for arm in ("baseline", "no_tier") if head.get(f"{arm}_ttft_p50_s") is not None]
    better = min(arms, key=lambda arm: head[f"{arm}_ttft_p50_s"], default=None)
    head["ttft_paired_vs_best"] = (
        None if better is None else paired_ratio(runs["tier"], runs[better])
    )
    return head


def paired_ratio(tier: dict[str, Any], other: dict[str, Any]) -> float | None:
    """The median over the measured requests of each one's TTFT in ``tier`` over the same
    request's in ``other`` (runs of one round); None without per-request TTFTs.

    A paired comparison: it does not move when the TTFTs near the median lie far apart, as a
    trace's do (a few requests restore much, a few compute much), where a p50 taken from each
    run alone jumps from one side of a gap to the other on a small shift of one request."""
    mine, theirs = tier.get("request_ttft_s"), other.get("request_ttft_s")
    if not mine or not theirs or len(mine) != len(theirs) or not all(theirs):
        return None
    return round(statistics.median(a / b for a, b in zip(mine, theirs, strict=True)), 4)


def summarize_rounds(rounds: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """The headline keys, each the median over the rounds (the one round's own value when
    there is one), and with several rounds every round's headline and order.

    ``ttft_p50_vs_best``, ``ttft_p90_vs_best`` and ``ttft_paired_vs_best`` are the medians of
    each round's own ratio (runs of one round ran side by side, under the same load), not the
    ratio of the medians: a round the whole machine slowed moves both of its runs, not one side
    of the ratio."""
    heads = [_head(runs) for runs in rounds]
    result: dict[str, Any] = {}
    for name in heads[0]:
        values = [h[name] for h in heads if h[name] is not None]
        result[name] = _median(values) if values else None
    if len(rounds) > 1:
        result["rounds"] = [
            dict(head, order=sorted(runs, key=lambda label: runs[label]["order"]))
            for head, runs in zip(heads, rounds, strict=True)
        ]
    return result


def _median(values: list[Any]) -> Any:
    middle = statistics.median(values)
    return round(middle) if isinstance(values[0], int) else middle
