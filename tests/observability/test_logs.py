"""The logging set-up of long-running commands: text or one JSON object per line."""

from __future__ import annotations

import json
import logging

import pytest

from kvcr_policy.errors import ArgumentError
from kvcr_policy.observability.logs import JsonFormatter, configure


def test_a_json_line_holds_the_record() -> None:
    record = logging.LogRecord("kvcr_policy.x", logging.WARNING, __file__, 1, "peer %s: %s",
                               ("127.0.0.1:7480", 'a "quoted"\nline'), None)  # fmt: skip
    line = JsonFormatter().format(record)
    assert "\n" not in line  # one record, one line
    data = json.loads(line)
    assert data["level"] == "warning" and data["logger"] == "kvcr_policy.x"
    assert data["message"] == 'peer 127.0.0.1:7480: a "quoted"\nline'
    assert data["time"].endswith("Z") and "exception" not in data


def test_an_exception_is_kept() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    assert "ValueError: boom" in json.loads(JsonFormatter().format(record))["exception"]


def test_an_unknown_level_is_refused_naming_the_choices() -> None:
    with pytest.raises(ArgumentError, match=r"--log-level: expected one of debug, info, warning"):
        configure("loud")
