"""A ``.env`` file: read only when it is private, then its variables as the environment is."""

from __future__ import annotations

import io
import re
from collections.abc import Mapping
from pathlib import Path

from dotenv import dotenv_values
from dotenv.parser import parse_stream

from ...errors import ConfigIssue
from ..private_files import dotenv_problem
from ..provenance import dotenv_origin
from ..schema import ENV_PREFIX
from ..user_files import MAX_CONFIG_BYTES, FileRefused, parse_problem, read_regular
from .common import (
    DOTENV_RESERVED,
    Leaves,
)
from .env import (
    _variables_source,
)

_NAME = re.compile(r"(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)")


def _named(line: str) -> str:
    """A line that does not parse, as a message shows it: its leading name only (the rest
    may be a secret's value)."""
    name = _NAME.match(line.strip())
    return f"the line of {name.group(1)}" if name else "a line"


def read_dotenv(path: Path) -> tuple[dict[str, str | None], list[ConfigIssue]]:
    """The variables of a ``.env`` file as pydantic-settings reads them, names as written.

    python-dotenv only logs a line it cannot parse and skips it; here that is a problem naming
    the line, so a typo cannot silently drop a setting. A file the user does not own, that
    others may write, or that sets ``security.*`` values and others may read, configures
    nothing (:func:`~kvcr_policy.config.private_files.dotenv_problem`): it is refused whole.
    """
    where = f"dotenv {path}"
    try:
        text = read_regular(path, MAX_CONFIG_BYTES).decode("utf-8")
    except (FileRefused, UnicodeDecodeError) as err:
        reason = err.reason if isinstance(err, FileRefused) else parse_problem(err)
        return {}, [ConfigIssue("<dotenv>", where, f"cannot read the .env file: {reason}")]
    bindings = list(parse_stream(io.StringIO(text)))
    issues = [
        ConfigIssue(
            "<dotenv>",
            where,
            f"line {binding.original.line}: cannot parse {_named(binding.original.string)}; "
            "expected NAME=VALUE (quote a value that holds spaces, quotes or '#')",
        )
        for binding in bindings
        if binding.error
    ]
    if issues:
        # The load fails; the well-formed lines are still checked, so that it reports every
        # problem at once (python-dotenv would log the bad lines a second time).
        return {b.key: b.value for b in bindings if b.key is not None}, issues
    # As DotEnvSettingsSource reads the file (case-sensitive: names as written), from the
    # text read above: that source would open the path again.
    variables = dict(dotenv_values(stream=io.StringIO(text)))
    security = ENV_PREFIX + "SECURITY__"
    problem = dotenv_problem(path, any(name.upper().startswith(security) for name in variables))
    if problem is not None:
        return {}, [ConfigIssue("<dotenv>", where, problem)]
    return variables, []


def dotenv_source(
    variables: Mapping[str, str | None], path: Path
) -> tuple[Leaves, list[ConfigIssue]]:
    """Leaf values from the ``KVCR_POLICY_*`` variables of a ``.env`` file at ``path``."""
    where = str(path)
    return _variables_source(
        variables,
        lambda name: dotenv_origin(where, name),
        f"remove it from {where}, or fix its name",
        reserved_ok=DOTENV_RESERVED,
    )
