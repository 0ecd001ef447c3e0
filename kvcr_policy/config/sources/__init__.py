"""Configuration sources: each turns one input into flat leaf values with their origins.

One module per source: :mod:`.profile`, :mod:`.env`, :mod:`.dotenv`, :mod:`.overrides`,
:mod:`.secrets`, on what they share (:mod:`.common`); this package re-exports their names.

The inputs are read as pydantic-settings' own sources read them, configured once by
:class:`PolicySettings`: ``EnvSettingsSource`` reads ``KVCR_POLICY_*`` variables (prefix, ``__``
nesting, JSON for complex fields); a profile is TOML parsed by ``tomllib`` and a ``.env`` file
is parsed by python-dotenv, as ``TomlConfigSettingsSource`` and ``DotEnvSettingsSource`` parse
them, but each file is read once, by :mod:`kvcr_policy.config.user_files` (a regular file only, at
most 1 MiB: those sources open the path themselves, which waits forever on a FIFO and reads a
device to the end). A source here returns ``{leaf path: (raw value,
origin)}`` plus the problems it found; loading merges the sources in precedence order and
validates once. Keeping sources separate (in pydantic-settings each source is a callable
returning a dict) is what lets every value remember who set it.

What this module adds to pydantic-settings: an unknown file key or ``KVCR_POLICY_*`` variable is
an error naming the nearest valid one (pydantic-settings ignores unknown prefixed variables); the
aliased and reserved variables; comma-separated lists and ``none`` for optional values; a
problem reported per variable rather than per section; and trust: a ``.env`` file or a secrets
directory is read only when it meets :mod:`.private_files`' rules (the secrets directory is read
here, not by pydantic-settings' ``SecretsSettingsSource``: see :func:`secrets_source`).
"""

from __future__ import annotations

from .common import (
    ALIASED_ENV,
    DOTENV_FILE,
    PROFILE_TABLE,
    RESERVED_ENV,
    SECRET_LEAVES,
    Leaves,
    PolicySettings,
    UnknownKeys,
    echo,
    env_name,
    flatten,
    known_leaves,
    suggest,
)
from .dotenv import dotenv_source, read_dotenv
from .env import env_source
from .overrides import override_source
from .profile import profile_source, read_profile
from .secrets import secrets_source

__all__ = [
    "ALIASED_ENV",
    "DOTENV_FILE",
    "PROFILE_TABLE",
    "RESERVED_ENV",
    "SECRET_LEAVES",
    "Leaves",
    "PolicySettings",
    "UnknownKeys",
    "dotenv_source",
    "echo",
    "env_name",
    "env_source",
    "flatten",
    "known_leaves",
    "override_source",
    "profile_source",
    "read_dotenv",
    "read_profile",
    "secrets_source",
    "suggest",
]
