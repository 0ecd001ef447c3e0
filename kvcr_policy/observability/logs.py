"""The logging set-up of a long-running command (``kvcr-policy serve``): plain text lines, or
one JSON object per line (``--log-format json``) for a collector that parses them.

A JSON line holds ``time`` (ISO 8601, UTC, milliseconds), ``level``, ``logger``, ``message``
(the formatted text, as the plain line shows it), ``process``, ``thread`` (its name) and,
when the record carries one, ``exception`` (the traceback text). The standard library's
:mod:`json` writes it; a formatter package (python-json-logger) would add a dependency for
these few lines.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import datetime, timezone
from enum import Enum

from ..errors import ArgumentError

__all__ = ["JsonFormatter", "LogFormat", "configure"]

TEXT_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"
LEVELS = ("debug", "info", "warning", "error", "critical")


class LogFormat(str, Enum):
    text = "text"
    json = "json"


class JsonFormatter(logging.Formatter):
    """One JSON object per record (module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        moment = datetime.fromtimestamp(record.created, timezone.utc)
        line = {
            "time": moment.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "process": record.process,
            "thread": record.threadName,
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)


def configure(level: str, fmt: LogFormat | str = LogFormat.text) -> None:
    """Log ``level`` and above to stderr as ``fmt`` lines (replacing any handler set before)."""
    name = level.strip().lower()
    if name not in LEVELS:
        message = f"--log-level: expected one of {', '.join(LEVELS)}, got {level!r}"
        raise ArgumentError(message)
    handler = logging.StreamHandler(sys.stderr)
    json_lines = LogFormat(fmt) is LogFormat.json
    handler.setFormatter(JsonFormatter() if json_lines else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=name.upper(), handlers=[handler], force=True)
