"""Which profile a load reads: bundled names, paths, ``[profile] base`` files, and the one
fallback every command shares (the argument, else ``KVCR_POLICY_PROFILE`` from the environment,
else from ``.env``); also which ``.env`` file is read."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Mapping
from pathlib import Path

from ..errors import ConfigError, ConfigIssue
from ..values import shorten
from .provenance import dotenv_origin
from .schema import ENV_PREFIX
from .sources import DOTENV_FILE, read_dotenv, suggest
from .user_files import file_kind

__all__ = [
    "PROFILE_ENV",
    "bundled_profiles",
    "choose_profile",
    "dotenv_file",
    "profile_or",
    "profiles_dir",
    "resolve_base",
    "resolve_profile",
]

PROFILE_ENV = ENV_PREFIX + "PROFILE"


def profiles_dir() -> Path:
    """The folder of bundled profiles."""
    return Path(__file__).resolve().parents[1] / "profiles"


def bundled_profiles() -> dict[str, Path]:
    """Bundled profile names and their files."""
    return {p.stem: p for p in sorted(profiles_dir().glob("*.toml"))}


def _kind(path: Path) -> str | None:
    """What ``path`` is when it exists but is no regular file (``a FIFO, not a regular file``)."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return None
    return None if stat.S_ISREG(mode) else f"{file_kind(mode)}, not a regular file"


def resolve_profile(profile: str | os.PathLike[str], where: str) -> Path:
    """A bundled name or a path -> the profile file; raise ConfigError naming the choices."""
    text = os.fspath(profile)
    bundled = bundled_profiles()
    if text in bundled:
        return bundled[text]

    def missing(nearest: str | None) -> str:
        hint = f"; did you mean {nearest!r}?" if nearest else ""
        return (
            f"no bundled profile or file named {shorten(text)}{hint} "
            f"(bundled: {', '.join(bundled) or 'none'}; or give a path to a .toml file)"
        )

    path = Path(text).expanduser()
    return _profile_file(path, text, shorten(text), ("profile", where), missing)


def resolve_base(name: str, folder: Path, where: str) -> Path:
    """A ``[profile] base``: a bundled name, else a path relative to the naming file's folder."""
    bundled = bundled_profiles()
    if name in bundled:
        return bundled[name]
    path = Path(name).expanduser()
    path = path if path.is_absolute() else folder / path

    def missing(nearest: str | None) -> str:
        hint = f" (did you mean {nearest!r}?)" if nearest else ""
        return (
            f"base {name!r} is neither a bundled profile{hint} nor a file (looked for {path}); "
            f"name one of: {', '.join(bundled)}, or a path relative to this file"
        )

    return _profile_file(path, name, f"base {name!r} ({path})", ("profile.base", where), missing)


def _profile_file(
    path: Path,
    name: str,
    shown: str,
    field: tuple[str, str],
    missing: Callable[[str | None], str],
) -> Path:
    """``path`` resolved where it is a file; else a ConfigError at ``field`` (the setting's path
    and origin): a directory, a device or a pipe (nothing a profile can be read from) named as
    ``shown``, or nothing there: ``missing`` with the bundled profile nearest ``name``."""
    if path.is_file():
        return path.resolve()
    kind = _kind(path)
    base = field[0] == "profile.base"
    if kind is not None:
        what = "a base" if base else "a profile"
        message = f"{shown} is {kind}; {what} is a bundled name or a .toml file"
    else:
        message = missing(suggest(name, list(bundled_profiles())))
    title = "cannot find a base" if base else "cannot select a profile"
    raise ConfigError([ConfigIssue(*field, message)], title=title)


def dotenv_file(dotenv: str | os.PathLike[str] | bool) -> Path | None:
    """The .env file to read: ``True`` is ``./.env`` when present, a path must exist."""
    if dotenv is False:
        return None
    if dotenv is True:
        default = Path(DOTENV_FILE)
        return default.resolve() if default.is_file() else None
    return Path(os.fspath(dotenv)).expanduser().resolve()


def choose_profile(
    profile: str | os.PathLike[str] | None,
    env: Mapping[str, str],
    dotenv_vars: Mapping[str, str | None],
    dotenv_path: Path | None,
) -> tuple[str | os.PathLike[str] | None, str]:
    """The one fallback every command shares: the argument, else the environment, else .env."""
    if profile is not None:
        return profile, "argument profile"
    if env.get(PROFILE_ENV):
        return env[PROFILE_ENV], f"env {PROFILE_ENV}"
    return dotenv_vars.get(PROFILE_ENV) or None, dotenv_origin(str(dotenv_path), PROFILE_ENV)


def profile_or(profile: str | None, default: str) -> str:
    """A command's profile: ``--profile``, else KVCR_POLICY_PROFILE (environment, then ./.env),
    else the command's own ``default``; a name from the environment is checked here so that its
    error names the variable it came from."""
    dotenv_path = dotenv_file(True)
    dotenv_vars = read_dotenv(dotenv_path)[0] if dotenv_path is not None else {}
    chosen, where = choose_profile(profile, os.environ, dotenv_vars, dotenv_path)
    if chosen is None:
        return default
    if profile is None:
        resolve_profile(chosen, where)
    return os.fspath(chosen)
