"""The bench's verdict in one line, said first, and why a ratio can pass 1.

``throughput vs default: restore 14.4 GB/s: 0.953 of the limit (15.1 GB/s, one contiguous copy)
and 0.412 of this host's memory copy (35.0 GB/s), 2.00x default; every byte verified``: who was
compared with whom; P's median restore rate; its ratio to the backend's own limit and to this
host's memory copy, each with the median of that limit; and P over the baseline, the median of
their ratios taken in the same moment (``speedup_vs_baseline``).

Every number is read from the JSON (``restore_gigabytes_per_s``, ``ratio_to_limit``,
``limit_gigabytes_per_s``, ``ratio_to_host_copy_limit``, ``host_copy_limit_gigabytes_per_s``,
``speedup_vs_baseline``), never computed again here, so the verdict and the JSON carry the same
ratio: :func:`~kvcr_policy.bench.result.ratio_to` defines it, once (the median of per-restore
ratios, each restore against the limits measured right before it). It need not equal the
quotient of the two medians shown beside it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["HOST_COPY_NOTE", "RATIO_NOTE", "headline", "ratio_note"]

#: Said wherever a ratio to the limit is above 1, which otherwise reads like an error.
RATIO_NOTE = (
    "A ratio to the limit above 1 is no error: the limit is one copy of the same bytes, "
    "measured alone right before each restore; the pipeline overlaps several moves at once, "
    "so it can beat a single copy."
)
#: Said wherever a ratio to this host's memory copy is above 1.
HOST_COPY_NOTE = (
    "A ratio to this host's memory copy above 1 is no error: that copy reads and writes host "
    "memory, where a restore into a GPU pool only reads it; and on a shared host each copy "
    "meets whatever else runs at that moment."
)


def _name(data: Mapping[str, Any], label: str) -> str:
    profile = data.get("profiles", {}).get(label) or {}
    return str(profile.get("name") or profile.get("path") or label)


def headline(data: Mapping[str, Any], baseline: str) -> str:
    """One line: P vs the baseline, P's restore against both limits and the baseline,
    verified; every figure as the JSON ``data`` has it (the module docstring)."""
    mine, theirs = _name(data, "P"), _name(data, baseline)
    ranks = data.get("ranks")
    who = f"{mine} vs {theirs}" + (f", {ranks} ranks" if ranks and ranks > 1 else "")
    checked = "every byte verified" if data.get("verified") else "RESTORED BYTES DID NOT MATCH"
    restore, limit = data["restore_gigabytes_per_s"], data["limit_gigabytes_per_s"]
    host = data["host_copy_limit_gigabytes_per_s"]
    return (
        f"{who}: restore {restore:.1f} GB/s: {data['ratio_to_limit']:.3f} of the limit "
        f"({limit:.1f} GB/s, {data['limit_short']}) and {data['ratio_to_host_copy_limit']:.3f} "
        f"of this host's memory copy ({host:.1f} GB/s), "
        f"{data['speedup_vs_baseline']:.2f}x {theirs}; {checked}"
    )


def _above_one(data: Mapping[str, Any], key: str) -> bool:
    ratios = [data.get(key), data.get(f"baseline_{key}")]
    ratios += [run.get(key) for run in data.get("runs", [])]
    return any(r is not None and r > 1 for r in ratios)


def ratio_note(data: Mapping[str, Any]) -> str | None:
    """:data:`RATIO_NOTE` when a ratio to the limit in ``data`` is above 1, and
    :data:`HOST_COPY_NOTE` when a ratio to the host's memory copy is; None when neither."""
    notes = [RATIO_NOTE] if _above_one(data, "ratio_to_limit") else []
    if _above_one(data, "ratio_to_host_copy_limit"):
        notes.append(HOST_COPY_NOTE)
    return " ".join(notes) or None
