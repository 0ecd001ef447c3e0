"""``--hicache-storage-backend-extra-config`` read the way SGLang 0.5.23 reads it.

SGLang takes the flag as JSON text, or as ``@FILE`` naming a ``.json``, ``.toml``, ``.yaml`` or
``.yml`` file (``HybridCacheController.parse_storage_backend_extra_config``). It parses the
flag itself before any backend is loaded, so a broken flag fails inside SGLang with a bare
``JSONDecodeError`` or ``FileNotFoundError``. :func:`read_flag` reads it by the same rules but
fails with one :class:`ConfigError` saying what, where, expected and how to fix it:
``kvcr-policy sglang-config --check VALUE`` runs it before a launch. The backend's own
``overrides`` key takes the same two forms inside the object (:func:`read_object`), so a file of
overrides can be shared by several deployments.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from ...config.user_files import MAX_CONFIG_BYTES, FileRefused, parse_problem, read_regular
from ...errors import ConfigError, ConfigIssue
from ...values import shorten

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the tomli backport (a dependency below 3.11)
    import tomli as tomllib

__all__ = ["FILE_FORMATS", "read_flag", "read_object"]

#: File extensions SGLang reads after ``@``, and what each holds.
FILE_FORMATS: Final = {".json": "JSON", ".toml": "TOML", ".yaml": "YAML", ".yml": "YAML"}


def _fail(path: str, origin: str, message: str) -> ConfigError:
    return ConfigError([ConfigIssue(path, origin, message)], title="cannot read the extra config")


def _read_file(name: str, path: str, origin: str) -> Any:
    file = Path(name).expanduser()
    kind = FILE_FORMATS.get(file.suffix.lower())
    if kind is None:
        message = (
            f"{shorten('@' + name)}: SGLang reads only {', '.join(FILE_FORMATS)} files after '@'; "
            f"got {file.suffix or 'no extension'}. Rename the file or pass the JSON inline"
        )
        raise _fail(path, origin, message)
    try:
        raw = read_regular(file, MAX_CONFIG_BYTES)  # never a FIFO or device; bounded
    except FileRefused as err:
        message = (
            f"{shorten('@' + name)}: cannot read the file ({err.reason}); fix the path after '@'"
        )
        raise _fail(path, origin, message) from None
    try:
        if kind == "TOML":
            return tomllib.loads(raw.decode("utf-8"))
        if kind == "YAML":
            try:
                import yaml
            except ImportError:
                message = (
                    f"{shorten('@' + name)}: reading YAML needs PyYAML, which SGLang imports for "
                    "this form too: pip install pyyaml, or use a .json or .toml file"
                )
                raise _fail(path, origin, message) from None
            return yaml.safe_load(raw)
        return json.loads(raw)
    except ConfigError:
        raise
    except Exception as err:  # ValueError, RecursionError, yaml.YAMLError and its kin
        # The parser's problem and position only: its excerpt of the text may be a secret.
        message = f"{shorten('@' + name)}: not valid {kind}: {parse_problem(err)}"
        raise _fail(path, origin, message) from None


def read_object(value: Any, path: str, origin: str) -> Mapping[str, Any]:
    """``value`` as a mapping: a mapping as is, ``@FILE`` read, other text parsed as JSON."""
    if isinstance(value, Mapping):
        return value
    if not isinstance(value, str):
        message = f"expected a JSON object, JSON text or @FILE; got {type(value).__name__}"
        raise _fail(path, origin, f"{message} {shorten(value)}")
    text = value.strip()
    from_file = text.startswith("@")
    if from_file:
        data = _read_file(text[1:], path, origin)
    else:
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as err:  # json recurses once per nesting level
            message = (
                f"not valid JSON ({parse_problem(err)}): {shorten(text)}. Quote the whole object "
                "in single quotes on a shell command line, or put it in a file and pass @FILE"
            )
            raise _fail(path, origin, message) from None
    if not isinstance(data, Mapping):
        # What a file holds is never shown: it may be a secret (a link to a secret file).
        got = type(data).__name__ if from_file else f"{type(data).__name__} {shorten(data)}"
        message = f"expected a JSON object (a table), got {got}"
        if from_file:
            message = f"{shorten(text)}: {message}"
        raise _fail(path, origin, message)
    return data


def read_flag(value: str) -> dict[str, Any]:
    """The object SGLang builds from the flag ``value``; :class:`ConfigError` if it cannot."""
    origin = "SGLang --hicache-storage-backend-extra-config"
    return dict(read_object(value, "extra_config", origin))
