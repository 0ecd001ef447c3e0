"""The bench's verdict in one line, said first, and why a ratio can pass 1.

``throughput vs default: restore 14.4 GB/s = 0.96 of the limit (15.1 GB/s), 2.00x default;
every byte verified``: who was compared with whom, P's median restore rate over the median
limit (the line's own arithmetic: 14.4 / 15.1), and P over the baseline, the median of their
ratios taken in the same moment (``speedup_vs_baseline``). The JSON's ``ratio_to_limit`` is
the median of per-restore ratios instead, so it may differ in the second decimal.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["RATIO_NOTE", "headline", "ratio_note"]

#: Said wherever a ratio to the limit is above 1, which otherwise reads like an error.
RATIO_NOTE = (
    "A ratio to the limit above 1 is no error: the limit is one copy of the same bytes, "
    "measured alone right before each restore; the pipeline overlaps several moves at once, "
    "so it can beat a single copy."
)


def _name(data: Mapping[str, Any], label: str) -> str:
    profile = data.get("profiles", {}).get(label) or {}
    return str(profile.get("name") or profile.get("path") or label)


def headline(data: Mapping[str, Any], baseline: str) -> str:
    """One line: P vs the baseline, P's restore against the limit and the baseline, verified."""
    mine, theirs = _name(data, "P"), _name(data, baseline)
    ranks = data.get("ranks")
    who = f"{mine} vs {theirs}" + (f", {ranks} ranks" if ranks and ranks > 1 else "")
    checked = "every byte verified" if data.get("verified") else "RESTORED BYTES DID NOT MATCH"
    restore, limit = data["restore_gigabytes_per_s"], data["limit_gigabytes_per_s"]
    return (
        f"{who}: restore {restore:.1f} GB/s = {restore / limit:.2f} of the limit "
        f"({limit:.1f} GB/s), {data['speedup_vs_baseline']:.2f}x {theirs}; {checked}"
    )


def ratio_note(data: Mapping[str, Any]) -> str | None:
    """:data:`RATIO_NOTE` when a ratio to the limit in ``data`` is above 1, else None."""
    ratios = [data.get("ratio_to_limit"), data.get("baseline_ratio_to_limit")]
    ratios += [run.get("ratio_to_limit") for run in data.get("runs", [])]
    return RATIO_NOTE if any(r is not None and r > 1 for r in ratios) else None
