"""The names a configuration gives its strategies, transport and backend, checked against the
registry, and each one's options validated by the model it registered (the second step of a
load, once the plugins are known)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

from ..errors import ConfigIssue
from ..values import shorten
from .issues import issues_from
from .provenance import DEFAULT, origin_for
from .schema import STRATEGY_SECTIONS, PolicyConfig
from .sources import suggest

if TYPE_CHECKING:
    from ..registry import Registry

__all__ = ["effective_eviction", "validate_strategies"]


def effective_eviction(config: PolicyConfig, origins: dict[str, str]) -> PolicyConfig:
    """``eviction.strategy`` as it takes effect: when unset, ``placement.eviction`` (the older
    spelling), with that value's origin, so ``show`` prints where the choice was made."""
    if config.eviction.strategy is not None:
        return config
    origins["eviction.strategy"] = origins.get("placement.eviction", DEFAULT)
    section = config.eviction.model_copy(update={"strategy": config.placement.eviction})
    return config.model_copy(update={"eviction": section})


def validate_strategies(
    config: PolicyConfig, origins: dict[str, str], registry: Registry
) -> tuple[PolicyConfig, dict[str, str], list[ConfigIssue]]:
    """Check each strategy name and validate its options with that strategy's own model."""
    issues: list[ConfigIssue] = []
    updates: dict[str, Any] = {}
    option_origins: dict[str, str] = {}
    named = [(section, kind, "strategy") for section, kind in STRATEGY_SECTIONS.items()]
    named.append(("transport", "transport", "name"))
    named.append(("backend", "backend", "name"))
    for section_name, kind, key in named:
        section = getattr(config, section_name)
        name = getattr(section, key)
        path = f"{section_name}.{key}"
        if kind == "backend":
            name = registry.backend_for(name, config.transport.name)
        spec = registry.find(kind, name)
        if spec is None:
            names = registry.names(kind)
            nearest = suggest(name, names)
            hint = f"; did you mean {nearest!r}?" if nearest else ""
            # The name may belong to a plugin that was blocked or failed: say which were skipped.
            skipped = ", ".join(f"{b.name} ({b.reason})" for b in registry.broken)
            noun = kind if kind in {"transport", "backend"} else f"{kind} strategy"
            message = (
                f"unknown {noun} "
                f"{shorten(name)}{hint} (registered: {', '.join(names) or 'none'}; "
                + (f"skipped plugins: {skipped}; " if skipped else "")
                + "`kvcr-policy plugins` lists them and who provides them)"
            )
            issues.append(ConfigIssue(path, origin_for(origins, path), message))
            continue
        model: type[BaseModel] = spec.options
        prefix = f"{section_name}.options."
        try:
            options = model.model_validate(section.options)
        except ValidationError as err:
            # Each option problem names whose options they are (they differ per strategy).
            owner = f" [options of {section_name} {name!r}]"
            found = issues_from(err, origins, model, prefix)
            issues += [replace(issue, message=issue.message + owner) for issue in found]
            continue
        dumped = options.model_dump(mode="json")
        updates[section_name] = section.model_copy(update={"options": dumped})
        for leaf in dumped:
            option_origins[prefix + leaf] = origins.get(prefix + leaf, DEFAULT)
    for path in [p for p in origins if ".options." in p]:
        origins.pop(path)
    if issues:
        return config, option_origins, issues
    return config.model_copy(update=updates), option_origins, issues
