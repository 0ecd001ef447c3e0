"""How config values are spelled and echoed: strict byte sizes, and a value cut for a message.

pydantic's :class:`~pydantic.ByteSize` matches its pattern at the start of the text only, so
``"64GiB garbage"`` parses as 64 GiB, and its ``\\d`` takes any Unicode digit (``"６４GiB"``).
:data:`Size` is ``ByteSize`` behind a whole-text, ASCII-only check: digits (an optional decimal
part), an optional known unit, and nothing after it, naming a whole number of bytes
(``1.5`` alone would be truncated to 1 byte; ``1.5KiB`` is 1536). :func:`parse_size` is the
same rule for command-line arguments. :func:`shorten` cuts a value echoed in an error message
(a 50 MB string must not come back whole on stderr), with :mod:`reprlib`, the standard
library's bounded repr.
"""

from __future__ import annotations

import re
import reprlib
from decimal import Decimal
from typing import Annotated, Any

from pydantic import BeforeValidator, ByteSize

from .errors import ArgumentError

__all__ = [
    "SIZE_FORMS", "SIZE_PATTERN", "SIZE_UNITS", "Size", "as_written", "check_size_text",
    "parse_size", "shorten", "sized",
]  # fmt: skip

#: Unit names ByteSize knows, lower case ("b", "kb", "kib", ... "eib").
SIZE_UNITS: frozenset[str] = frozenset(ByteSize.byte_sizes)
_SIZE_TEXT = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", re.ASCII)
_EXAMPLES = "e.g. 512MiB, 64GiB or 1048576"
#: The accepted forms, as every refusal lists them.
SIZE_FORMS = (
    "bytes: a number alone, or with a unit: decimal B, KB, MB, GB, TB, PB, EB (1000s) or binary "
    "KiB, MiB, GiB, TiB, PiB, EiB (1024s); all-lower-case units (gib, gb) read the same"
)

_repr = reprlib.Repr()
_repr.maxstring = 80
_repr.maxother = 80
_repr.maxlist = _repr.maxtuple = _repr.maxdict = _repr.maxset = 6
_repr.maxlevel = 3


def sized(n: float) -> str:
    """``n`` bytes in the largest binary unit it reaches (``64GiB``, ``1.50MiB``, ``512B``)."""
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            value = n / (1 << shift)
            return f"{value:.0f}{unit}" if value == int(value) else f"{value:.2f}{unit}"
    return f"{int(n)}B"


def as_written(text: str | None, n: int) -> str:
    """A size as it was written, with its binary size beside it where that says more
    (``64GB (59.6 GiB)``); ``64GiB`` stays ``64GiB``; no text: the binary size alone."""
    binary = sized(n)
    if text is None:
        return binary
    if text.strip().lower().endswith("ib"):  # a binary unit already says it
        return text.strip()
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{text.strip()} ({n / (1 << shift):.1f} {unit})"
    return f"{text.strip()} ({n} B)"


def _bits(unit: str) -> bool:
    """A unit of bits: a capital prefix and a small b (Gb, Mb, Kib, Gib), or ``bit`` spelled
    out; all-lower-case units (gb, gib) stay bytes, as the tools operators come from read them."""
    if unit.lower().endswith(("bit", "bits")):
        return True
    return unit.endswith("b") and unit != unit.lower()


def shorten(value: Any) -> str:
    """``repr(value)``, cut to about 80 characters (strings keep their head and tail)."""
    return _repr.repr(value)


def check_size_text(value: Any) -> Any:
    """Refuse text that is not a whole, ASCII size; other values pass to ByteSize unchanged."""
    if isinstance(value, bool):
        raise ValueError(f"expected a size ({_EXAMPLES}), got a boolean")
    if not isinstance(value, str):
        return value
    match = _SIZE_TEXT.fullmatch(value)
    if match is None:
        message = (
            f"expected a size: ASCII digits, then an optional unit and nothing after it "
            f"({_EXAMPLES}); got {shorten(value)}"
        )
        raise ValueError(message)
    unit = match.group(2).lower()
    if _bits(match.group(2)):
        message = (
            f"{value.strip()!r} is in bits ({match.group(2)}: a lower-case b or 'bit' means bits); "
            f"a size is in {SIZE_FORMS}"
        )
        raise ValueError(message)
    if unit and unit not in SIZE_UNITS:
        message = f"unknown size unit {match.group(2)!r}; a size is in {SIZE_FORMS}"
        raise ValueError(message)
    number = Decimal(match.group(1)) * Decimal(ByteSize.byte_sizes[unit or "b"])
    if number != number.to_integral_value():
        message = (
            f"expected a whole number of bytes ({_EXAMPLES}), got {shorten(value)} = {number} bytes"
        )
        raise ValueError(message)
    return value


#: The text rule of :data:`Size` as a JSON Schema pattern (the committed schema shows this one,
#: not ByteSize's looser own: see ``kvcr_policy.config.order``).
SIZE_PATTERN = r"^\s*[0-9]+(\.[0-9]+)?\s*[A-Za-z]*\s*$"

#: A byte size as config spells it: ByteSize behind :func:`check_size_text`.
Size = Annotated[ByteSize, BeforeValidator(check_size_text)]


def parse_size(text: str, *, what: str, low: int = 1, high: int = 1 << 50) -> int:
    """A command-line size, strict as :data:`Size`, in ``[low, high]``; ArgumentError if not."""
    from pydantic import TypeAdapter, ValidationError

    try:
        size = int(TypeAdapter(Size).validate_python(text))
    except ValidationError as err:
        reason = err.errors(include_url=False)[0]["msg"].removeprefix("Value error, ")
        raise ArgumentError(f"{what}: {reason}") from None
    if not low <= size <= high:
        message = f"{what}: expected a size from {low} to {high} bytes, got {size} ({text!r})"
        raise ArgumentError(message)
    return size
