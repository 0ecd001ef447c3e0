"""How long a restore takes: the host's link shared by its ranks, the prefix capped by the tier.

The link limit (``--link-limit``, ``observability.link_limit_gbps`` or ``--measure-link``) is
the host's: every rank of a host restores its share of a prefix at the same moment (tensor
parallel ranks serve one request together), and they share the host's memory and network, so
each gets the limit divided by the ranks of the host, never the whole limit at once. A prefix
larger than what one pool's tier holds is not restored whole: the oldest pages were evicted, so
no time is predicted for it, only for the part the tier can hold.
"""

from __future__ import annotations

import math
from typing import Any

from ..values import sized

__all__ = ["link_figures", "restore_time"]


def link_figures(gbps: float | None, origin: str, ranks: int) -> dict[str, Any]:
    """The link limit per host and what each of the host's ``ranks`` gets when all move."""
    return {
        "gigabytes_per_s": gbps,
        "from": origin if gbps else None,
        "per": "host",
        "ranks_sharing": ranks,
        "gigabytes_per_s_per_rank": gbps / ranks if gbps else None,
    }


def restore_time(
    restore: dict[str, Any], tier: dict[str, Any], page_size: int, link: dict[str, Any]
) -> tuple[dict[str, Any], list[str]]:
    """The restore's time figures (added to ``restore``) and the warnings they raise."""
    tokens, pages, nbytes = restore["prefix_tokens"], restore["pages"], restore["bytes"]
    held = min(tokens, tier["tokens_per_pool"])
    held_bytes = math.ceil(held / page_size) * (nbytes // pages) if pages else 0
    ranks, gbps = link["ranks_sharing"], link["gigabytes_per_s"]
    figures: dict[str, Any] = {
        "link_gigabytes_per_s": gbps,
        "link_from": link["from"],
        "link_per": "host",
        "ranks_restoring_at_once": ranks,
        "link_gigabytes_per_s_per_rank": link["gigabytes_per_s_per_rank"],
        "bytes_per_host": nbytes * ranks,
        "held_tokens": held,
        "predicted_seconds": None,
        "predicted_seconds_held": None,
    }
    warnings: list[str] = []
    if gbps:
        figures["predicted_seconds_held"] = held_bytes * ranks / (gbps * 1e9)
        if held == tokens:
            figures["predicted_seconds"] = nbytes * ranks / (gbps * 1e9)
    if held < tokens:
        at = (
            f"; the {held} tokens it holds restore in {figures['predicted_seconds_held']:.3f} s"
            if gbps
            else ""
        )
        warnings.append(
            f"no restore time for a prefix of {tokens} tokens ({sized(nbytes)} per rank): a "
            f"pool's tier holds {tier['tokens_per_pool']} tokens, so at most those come back "
            f"from it{at}; raise placement.capacity_bytes to restore the whole prefix"
        )
    return figures, warnings
