"""``audit``: open a tier region as the profile places it and report where its pages landed."""

from __future__ import annotations

from typing import Annotated

import typer

from ..config.loading import load_config
from .options import PlainFormat, ProfileOpt, SetOpt, out, overrides, print_json, size_option

__all__ = ["audit"]


def audit(
    profile: ProfileOpt = None,
    set_: SetOpt = None,
    size: Annotated[str, typer.Option("--size", help="Region size to open, e.g. 1GiB.")] = "1GiB",
    format: Annotated[PlainFormat, typer.Option("--format", "-f")] = PlainFormat.table,
) -> None:
    """Open a tier region as the profile places it and report where its pages really landed."""
    from ..memory.audit_text import format_audit
    from ..memory.preflight import TierRequest, check_tier, mapped_bytes

    loaded = load_config(profile=profile, overrides=overrides(set_))
    config = loaded.config
    registry = loaded.registry
    assert registry is not None  # every load_config result carries the registry it used
    spec = registry.get("placement", config.placement.strategy)
    placement = spec.create(config.placement, options=config.placement.options)
    nbytes = size_option(size)
    request = TierRequest("the audited region", mapped_bytes(nbytes), config.placement.prefault)
    check_tier(request, nbytes, "the command line", setting="--size")  # not killed: refused
    region = placement.open_region("audit", nbytes)
    try:
        result = region.audit()
    finally:
        region.close()
    if format is PlainFormat.json:
        print_json({"profile": loaded.profile, "audit": result.to_dict()})
    else:
        out.print(format_audit(result), markup=False, highlight=False)
