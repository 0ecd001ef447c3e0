"""``kvcr-policy bench --sweep``: every page shape of a matrix, one run each, one table.

A change to a copy path is checked against every shape at once: page sizes from 256 KiB to
16 MiB, contiguous and scattered tier slots, MHA and MLA, each layout, from 16k to 116k
tokens, one rank and several. Each row is one ordinary run of the benchmark (the command's
profiles, ``--repeat``, ``--set`` and ``--vs-set`` apply to every row), so each row's ratios
are to limits measured in its own run. The table gives P's restore over the limit in both
orders, the baseline's, both stores over the store's limit (the backend's move of the same
bytes into its emptied tier, right before each store; where the backend has none, the
restore's limit; medians of ``repeat`` stores in each order), and whether P was at least the
baseline, restores in both orders and the store; ``--screen`` applies to every row.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from .result import BenchResult
from .setup import BenchSetup

__all__ = ["MATRICES", "SweepShape", "run_sweep", "sweep_row"]


@dataclass(frozen=True, slots=True)
class SweepShape:
    """One row of a matrix: a model's page shape and the run's axes."""

    #: The model's name (a preset's, or what its dimensions are).
    name: str
    #: ``layers``, ``heads``, ``head_dim``, ``dtype``, ``page_size`` and ``mla``.
    dims: Mapping[str, Any]
    layout: str = "layer_first"
    tokens: int = 16384
    scatter: bool = False
    tp: int | None = None
    ranks: int = 1
    devices: tuple[int, ...] | None = None

    @property
    def label(self) -> str:
        """The shape as a short line: name, MLA, scattered, TP and ranks."""
        parts = [self.name + (" MLA" if self.dims.get("mla") else "")]
        parts += ["scattered"] * self.scatter
        parts += [f"tp {self.tp}"] if self.tp else []
        if self.ranks > 1:
            on = ",".join(map(str, self.devices)) if self.devices else "own GPUs"
            parts.append(f"{self.ranks} ranks ({on})")
        return ", ".join(parts)

    def setup(self, base: BenchSetup) -> BenchSetup:
        """``base`` (the command's profiles and options) with this shape's axes."""
        return replace(
            base,
            geometry=self.name,
            dims={key: value for key, value in self.dims.items() if key != "mla"},
            mla=bool(self.dims.get("mla", False)),
            layout=self.layout,
            tokens=self.tokens,
            scatter=self.scatter,
            tp=self.tp,
            ranks=self.ranks,
            devices=self.devices,
            exists_keys=_EXISTS_KEYS,
        )


_QWEN = {"layers": 64, "heads": 8, "head_dim": 128, "dtype": "bfloat16", "page_size": 64}
_QWEN_MLA = {**_QWEN, "heads": 1, "mla": True}
_SMALL = {"layers": 16, "heads": 8, "head_dim": 64, "dtype": "bfloat16", "page_size": 16}
_DEEPSEEK = {"layers": 61, "heads": 1, "head_dim": 576, "dtype": "bfloat16", "page_size": 64,
             "mla": True}  # fmt: skip
_MLA_SMALL = {"layers": 8, "heads": 1, "head_dim": 576, "dtype": "bfloat16", "page_size": 32,
              "mla": True}  # fmt: skip
_Q, _S = "qwen3-32b", "small"
_S8 = ("small, page 8", {**_SMALL, "page_size": 8})

#: The matrices: ``cuda`` (one GPU, and two ranks sharing it) and ``cpu``. Sizes keep a
#: ``--repeat 3`` sweep within minutes: the default profile moves small fragments at a few
#: GB/s, so the shapes made of them are the smallest.
MATRICES: dict[str, tuple[SweepShape, ...]] = {
    "cuda": (
        SweepShape(_Q, _QWEN, tokens=32768),
        SweepShape(_Q, _QWEN, tokens=32768, scatter=True),
        SweepShape(_Q, _QWEN, tokens=16384, scatter=True),
        SweepShape(_Q, _QWEN, tokens=115968, scatter=True, tp=8),
        SweepShape(_Q, _QWEN_MLA, tokens=115968),
        SweepShape(_Q, _QWEN_MLA, tokens=115968, scatter=True),
        SweepShape(_Q, _QWEN_MLA, tokens=16384, scatter=True),
        SweepShape(_Q, _QWEN_MLA, layout="page_first", tokens=115968, scatter=True),
        SweepShape(_Q, _QWEN_MLA, layout="page_first_direct", tokens=65536, scatter=True),
        SweepShape("MLA 61x576", _DEEPSEEK, tokens=32768, scatter=True),
        SweepShape(_S, _SMALL, tokens=65536, scatter=True),
        SweepShape(*_S8, tokens=32768, scatter=True),
        SweepShape(*_S8, layout="page_first", tokens=65536, scatter=True),
        SweepShape(_Q, _QWEN, layout="page_head", tokens=16384),
        SweepShape(_Q, _QWEN, layout="page_first_direct", tokens=16384, scatter=True),
        SweepShape(_Q, _QWEN, layout="page_first", tokens=65536, scatter=True, tp=8),
        SweepShape(_Q, _QWEN, tokens=32768, ranks=2, devices=(0, 0)),
        SweepShape(_Q, _QWEN_MLA, tokens=65536, scatter=True, ranks=2, devices=(0, 0)),
    ),
    "cpu": (
        SweepShape("16x8x128, page 16", {**_SMALL, "head_dim": 128}, scatter=True),
        SweepShape("MLA 8x576, page 32", _MLA_SMALL, scatter=True),
        SweepShape(_S, _SMALL, scatter=True),
        SweepShape(_S, _SMALL),
        SweepShape(_S, _SMALL, layout="page_first", scatter=True),
        SweepShape(_S, _SMALL, layout="page_head", scatter=True),
        SweepShape(*_S8, scatter=True),
    ),
}

#: Keys of each row's metadata figure: the sweep reports restores and stores only.
_EXISTS_KEYS = 1


def _store_ratio(result: BenchResult, label: str) -> float:
    """Side ``label``'s store over the store's own limit (the backend's move into the emptied
    tier, measured right before each store) where the backend has one, else over the restore's
    limit (the row's ``store_limit`` says which)."""
    ratio = result.store_ratio.get(label)
    return ratio if ratio is not None else result.store_gbps[label] / result.limit_gbps


def sweep_row(shape: SweepShape, result: BenchResult, screen_pct: float | None) -> dict[str, Any]:
    """One row of the table (and of the JSON's ``shapes``)."""
    base = result.baseline
    limit = result.limit_gbps
    orders = {
        order: {
            "ratio_to_limit": round(result.ratio_to_limit("P", order), 3),
            "baseline_ratio_to_limit": round(result.ratio_to_limit(base, order), 3),
        }
        for order in result.orders
    }
    stores = _store_ratio(result, "P"), _store_ratio(result, base)
    # At least the baseline: restores in both orders, and the store (a profile slower than
    # upstream's default in either direction is a defect).
    at_least = stores[0] >= stores[1] and all(
        o["ratio_to_limit"] >= o["baseline_ratio_to_limit"] for o in orders.values()
    )
    row: dict[str, Any] = {
        "shape": shape.label,
        "tp": shape.tp,
        "ranks": shape.ranks,
        "layout": shape.layout,
        "tokens": shape.tokens,
        "page_bytes": result.page_bytes,
        "bytes": result.nbytes,
        "verified": result.verified,
        "ratio_to_limit": round(result.ratio_to_limit("P"), 3),
        "baseline_ratio_to_limit": round(result.ratio_to_limit(base), 3),
        "orders": orders,
        "store_ratio_to_limit": round(stores[0], 3),
        "baseline_store_ratio_to_limit": round(stores[1], 3),
        "store_limit": "pool -> tier" if "P" in result.store_ratio else "tier -> pool",
        "at_least_baseline": at_least,
        "limit_gigabytes_per_s": round(limit, 3),
        "device": result.extra.get("device"),
    }
    if screen_pct is not None:
        row["screen"] = result.screen(screen_pct).to_dict()
    return row


def run_sweep(
    shapes: Sequence[SweepShape],
    run: Callable[[int], BenchResult],
    screen_pct: float | None,
    say: Callable[[str], None],
) -> list[dict[str, Any]]:
    """Run shape ``i`` of ``shapes`` with ``run(i)``, one after another; the table's rows."""
    rows = []
    for i, shape in enumerate(shapes):
        named = f"{shape.label}, {shape.layout}, {shape.tokens} tokens"
        say(f"sweep {i + 1}/{len(shapes)}: {named}")
        row = sweep_row(shape, run(i), screen_pct)
        rows.append(row)
        say(f"sweep {i + 1}/{len(shapes)} done: {named}: P {_pair(row, 'ratio_to_limit')}, "
            f"baseline {_pair(row, 'baseline_ratio_to_limit')}, store "
            f"{row['store_ratio_to_limit']:.3f} / {row['baseline_store_ratio_to_limit']:.3f}, "
            f"{'verified' if row['verified'] else 'NOT VERIFIED'}")  # fmt: skip
    return rows


def _pair(row: Mapping[str, Any], key: str) -> str:
    return " / ".join(f"{order[key]:.3f}" for order in row["orders"].values())


_COLUMNS = ("shape", "layout", "tokens", "page", "restore P (P,Q / Q,P)", "baseline",
            "store P", "store baseline", "P >= baseline", "verified")  # fmt: skip


def sweep_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The rows as a Markdown table (a terminal reads it; a note takes it as it is): P and the
    baseline over the limit in each order, both stores over the limit."""
    lines = ["| " + " | ".join(_COLUMNS) + " |", "|" + "---|" * len(_COLUMNS)]
    for row in rows:
        page = row["page_bytes"]
        size = f"{page / 2**20:.2f} MiB" if page >= 1 << 20 else f"{page >> 10} KiB"
        cells = (
            row["shape"], row["layout"], str(row["tokens"]), size,
            _pair(row, "ratio_to_limit"), _pair(row, "baseline_ratio_to_limit"),
            f"{row['store_ratio_to_limit']:.3f}", f"{row['baseline_store_ratio_to_limit']:.3f}",
            "yes" if row["at_least_baseline"] else "NO", "yes" if row["verified"] else "NO",
        )  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
