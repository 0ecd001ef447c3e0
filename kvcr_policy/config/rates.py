"""How a rate is spelled: a number and its unit, bytes or bits per second, never a bare number.

"Gbps" means gigabits to a network engineer and gigabytes to a storage one; a bare ``50`` is
worse. Every rate the configuration or the command line takes names its unit: ``50GB/s``,
``400Gbit/s``, ``46.6GiB/s``, ``800Mbit/s``. :func:`parse_rate` turns such text into bytes per
second; a bare number, an unknown unit or an ambiguous one (``Gbps``, ``Gb/s``) is refused
with one message listing :data:`RATE_FORMS`. Inside, rates stay floats in GB/s (10**9 bytes
per second), the unit every ``*_gb_per_s`` output and ``GB/s`` column names;
:func:`spell_gb_per_s` writes one back as text that parses to the same value.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BeforeValidator, PlainSerializer, WithJsonSchema

from ..values import shorten

__all__ = [
    "MAX_LINK_GBPS",
    "MIN_LINK_GBPS",
    "RATE_FORMS",
    "RATE_PATTERN",
    "RATE_UNITS",
    "GBPerSecond",
    "gb_per_s_from_text",
    "parse_gb_per_s",
    "parse_rate",
    "spell_gb_per_s",
]

#: A link's rate in GB/s, from 1 MB/s to 100 TB/s (observability.link_limit_gbps's bounds).
MIN_LINK_GBPS, MAX_LINK_GBPS = 0.001, 100000.0
#: Bytes per second of one of each unit; units end in B/s (bytes) or bit/s (bits).
RATE_UNITS: dict[str, float] = {
    "B/s": 1.0,
    "kB/s": 1e3,
    "KB/s": 1e3,
    "MB/s": 1e6,
    "GB/s": 1e9,
    "TB/s": 1e12,
    "KiB/s": 2.0**10,
    "MiB/s": 2.0**20,
    "GiB/s": 2.0**30,
    "TiB/s": 2.0**40,
    "bit/s": 1 / 8,
    "kbit/s": 1e3 / 8,
    "Mbit/s": 1e6 / 8,
    "Gbit/s": 1e9 / 8,
    "Tbit/s": 1e12 / 8,
}
#: The accepted forms, as every refusal lists them.
RATE_FORMS = (
    "a number and a unit: bytes as B/s, kB/s, MB/s, GB/s, TB/s, KiB/s, MiB/s, GiB/s, TiB/s, "
    "or bits as bit/s, kbit/s, Mbit/s, Gbit/s, Tbit/s (e.g. 50GB/s, 400Gbit/s, 46.6GiB/s)"
)
_UNIT = "|".join(re.escape(unit) for unit in sorted(RATE_UNITS, key=len, reverse=True))
#: The whole text of a rate: ASCII digits, an optional decimal part, a unit.
RATE_PATTERN = rf"^\s*([0-9]+(?:\.[0-9]+)?|\.[0-9]+)\s*({_UNIT})\s*$"
_RATE_TEXT = re.compile(RATE_PATTERN, re.ASCII)


def parse_rate(text: Any) -> float:
    """Bytes per second of a rate's text (``400Gbit/s`` is 5e10); ValueError naming the forms."""
    number, unit = _split(text)
    return number * RATE_UNITS[unit]


def parse_gb_per_s(text: Any) -> float:
    """GB/s of a rate's text; ``50.1GB/s`` is exactly ``50.1`` (no round trip through bytes)."""
    number, unit = _split(text)
    return number * (RATE_UNITS[unit] / 1e9)


def _split(text: Any) -> tuple[float, str]:
    if isinstance(text, bool) or not isinstance(text, str):
        bare = isinstance(text, (int, float)) and not isinstance(text, bool)
        kind = "a bare number" if bare else type(text).__name__
        raise ValueError(f"expected a rate, {RATE_FORMS}; got {kind} {shorten(text)}")
    match = _RATE_TEXT.fullmatch(text)
    if match is None:
        bare = re.fullmatch(r"\s*[0-9.eE+-]+\s*", text) is not None
        what = "a bare number " if bare else ""
        raise ValueError(f"expected a rate, {RATE_FORMS}; got {what}{shorten(text)}")
    return float(match.group(1)), match.group(2)


def gb_per_s_from_text(value: Any) -> Any:
    """A config value: rate text -> GB/s; None (unset) passes; anything else is refused."""
    if value is None:
        return None
    return parse_gb_per_s(value)


def spell_gb_per_s(value: float | None) -> str | None:
    """A GB/s float as rate text that parses back to the same float (``50.0GB/s``)."""
    return None if value is None else f"{value!r}GB/s"


#: An optional config rate: written with its unit, held as a float in GB/s (None: unset),
#: shown as ``<float>GB/s``.
GBPerSecond = Annotated[
    float | None,
    BeforeValidator(gb_per_s_from_text),
    PlainSerializer(spell_gb_per_s, return_type=str | None),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "pattern": RATE_PATTERN, "examples": ["50GB/s", "400Gbit/s"]},
                {"type": "null"},
            ]
        }
    ),
]
