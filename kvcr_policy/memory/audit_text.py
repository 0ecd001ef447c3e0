"""The human table of a placement audit (``kvcr-policy audit``)."""

from __future__ import annotations

from . import linux as _os
from .region import PlacementAudit

__all__ = ["format_audit"]


def format_audit(audit: PlacementAudit) -> str:
    """A short human table of an audit."""
    mib = 1 << 20
    nodes = ", ".join(
        f"{k}: {v}" for k, v in sorted(audit.pages_per_node.items(), key=lambda kv: str(kv[0]))
    )
    lines = [
        f"tier {audit.name!r}: {audit.bytes / mib:.1f} MiB ({audit.state}"
        f"{', LEAKED' if audit.leaked else ''})",
        f"  prefault     {audit.prefault_method if audit.prefaulted else 'no'}",
        f"  huge pages   asked {audit.huge_pages_requested}, obtained "
        f"{audit.huge_page_bytes / mib:.1f} MiB ({audit.huge_page_ratio:.0%})",
        f"  numa         asked {audit.numa_policy_requested} "
        f"{_os.format_node_list(audit.numa_nodes_requested) or '-'} ({audit.numa_mode}), obtained "
        f"{audit.numa_policy_obtained} {_os.format_node_list(audit.numa_nodes_obtained) or '-'}",
        f"  pages/node   {nodes or '-'} (sampled {audit.numa_sampled_pages} of "
        f"{audit.numa_total_pages} pages)",
    ]
    if audit.numa_near:
        lines.append(f"  near         {audit.numa_near}")
    lines += [f"  fallback     {what}: {why}" for what, why in audit.fallbacks]
    return "\n".join(lines)
