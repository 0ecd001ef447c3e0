"""Origins: where each effective value came from, as data, and how origins are shown.

An origin is a short string, one of::

    default
    profile /path/to/NAME.toml [table]
    env KVCR_POLICY_SECTION__FIELD
    dotenv /path/to/.env KVCR_POLICY_SECTION__FIELD
    secrets /path/to/secrets-dir/FILE
    override

``origins`` maps every leaf path (``"batching.read_batch_pages"``) to its origin.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = [
    "DEFAULT",
    "OVERRIDE",
    "dotenv_origin",
    "env_origin",
    "origin_for",
    "profile_origin",
    "secrets_origin",
]

DEFAULT = "default"
OVERRIDE = "override"


def profile_origin(path: str, table: str) -> str:
    """The origin of a value read from ``table`` of the profile file at ``path``."""
    return f"profile {path} [{table}]"


def env_origin(name: str) -> str:
    """The origin of a value read from the environment variable ``name``."""
    return f"env {name}"


def dotenv_origin(path: str, name: str) -> str:
    """The origin of a value read from the variable ``name`` of the .env file at ``path``."""
    return f"dotenv {path} {name}"


def secrets_origin(path: str) -> str:
    """The origin of a value read from the file at ``path`` of a secrets directory."""
    return f"secrets {path}"


def origin_for(origins: Mapping[str, str], path: str) -> str:
    """The origin of ``path``, or of the values under it, or of its nearest parent.

    Validation errors point at leaves, sections (cross-field rules) or the root, so this looks
    for an exact match first, then for the non-default origins below ``path``, then upwards the
    same way (a required option that is missing belongs to the table that lacks it).
    """
    if path in origins:
        return origins[path]
    parts = path.split(".")
    while parts:
        below = _set_below(origins, ".".join(parts))
        if below:
            return below
        parts.pop()
        parent = ".".join(parts)
        if parent in origins:
            return origins[parent]
    return DEFAULT


def _set_below(origins: Mapping[str, str], path: str) -> str:
    """The non-default origins of the values under ``path``, joined; empty if none."""
    below = {o for key, o in origins.items() if key.startswith(path + ".") and o != DEFAULT}
    return ", ".join(sorted(below))
