"""Request traces in Mooncake's format (FAST'25), read and checked line by line.

One JSON object per line, requests in arrival order (a ``.gz`` or ``.xz`` file is read through
its compression)::

    {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 48]}

``timestamp`` is the arrival in milliseconds; ``hash_ids`` names the prompt's blocks of
``block_tokens`` tokens in order (equal ids: the same prefix block); ``input_length`` may end
inside the last block. Other keys are ignored. A line that breaks a rule is refused with its
line number, what was expected and what was found; sizes are bounded (:data:`MAX_REFERENCES`
block references, ids below 2**63), so a trace is held in a few compact arrays, and so is the
work of reading one: at most :data:`MAX_LINES` lines (a request with no ``hash_ids`` costs no
reference, but still a line) and :data:`MAX_TRACE_CHARS` characters once decompressed (a
17 MiB gzip can inflate to 6 GB). The file is opened by :mod:`kvcr_policy.config.user_files`: a FIFO
or a device is refused at once.
"""

from __future__ import annotations

import gzip
import io
import json
import lzma
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ..config.user_files import FileRefused, open_regular
from ..errors import ArgumentError
from ..values import shorten

__all__ = [
    "MAX_BLOCK_TOKENS",
    "MAX_BYTES_REQUESTS",
    "MAX_INPUT_TOKENS",
    "MAX_LINES",
    "MAX_REFERENCES",
    "MAX_TRACE_CHARS",
    "Trace",
    "read_trace",
]

#: Most tokens per block id (``plan --block-tokens``).
MAX_BLOCK_TOKENS = 1 << 20
#: Most requests of a trace's head that a ``plan --trace --bytes`` replay stores and restores.
MAX_BYTES_REQUESTS = 1_000_000
#: Most block references (sum of every request's hash_ids) a trace may hold: 2**26, about
#: 230 times Mooncake's conversation trace (288,500), 512 MiB of ids.
MAX_REFERENCES = 1 << 26
#: Longest prompt: 2**31 - 1 tokens.
MAX_INPUT_TOKENS = (1 << 31) - 1
#: Latest arrival: 10**15 ms (about 31,700 years).
_MAX_TIMESTAMP = 10**15
_MAX_ID = (1 << 63) - 1
#: Longest line read: 64 Mi characters (a 2**31-token prompt's ids fit in well under it).
_MAX_LINE = 1 << 26
#: Most lines (requests and blank lines) a trace may have: 2**21, about 90 times the longest
#: of Mooncake's published traces (toolagent, 23,608 requests).
MAX_LINES = 1 << 21
#: Most characters read, decompressed: 2 Gi, room for MAX_REFERENCES ids of 20 digits.
MAX_TRACE_CHARS = 1 << 31


#: Compressed traces are read by their suffix (Python's own gzip and lzma).
_OPENERS: dict[str, Any] = {".gz": gzip.open, ".xz": lzma.open}


def _plain(raw: IO[bytes], mode: str, encoding: str) -> IO[str]:
    """An uncompressed trace: the text of the open file ``raw``."""
    return io.TextIOWrapper(raw, encoding=encoding)


@dataclass(frozen=True, slots=True, eq=False)
class Trace:
    """A checked trace: per request its arrival (ms), its input tokens and its block ids
    (``ids[starts[i]:starts[i + 1]]``)."""

    path: str
    block_tokens: int
    timestamps: array  # float64, ms, non-decreasing
    inputs: array  # int64 tokens
    starts: array  # int64, requests + 1 offsets into ids
    ids: array  # int64 block ids, every request's in order

    @property
    def requests(self) -> int:
        return len(self.inputs)

    @property
    def references(self) -> int:
        return len(self.ids)

    @property
    def input_tokens(self) -> int:
        return sum(self.inputs)

    @property
    def duration_s(self) -> float:
        """From the first arrival to the last, in seconds."""
        return (self.timestamps[-1] - self.timestamps[0]) / 1000 if self.timestamps else 0.0

    def blocks(self, request: int) -> list[int]:
        """The block ids of one request, in order."""
        return self.ids[self.starts[request] : self.starts[request + 1]].tolist()

    def head(self, count: int) -> Trace:
        """The first ``count`` requests."""
        count = min(count, self.requests)
        end = self.starts[count]
        return Trace(
            self.path,
            self.block_tokens,
            self.timestamps[:count],
            self.inputs[:count],
            self.starts[: count + 1],
            self.ids[:end],
        )


def _refuse(path: str, line: int, what: str, got: Any) -> ArgumentError:
    message = (
        f"trace {path} line {line}: {what}; got {shorten(got)} (a line is one JSON object: "
        '{"timestamp": ms, "input_length": tokens, "hash_ids": [block ids]}, requests in '
        "arrival order; fix or drop the line)"
    )
    return ArgumentError(message)


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _request(path: str, number: int, text: str, block_tokens: int) -> tuple[float, int, list[int]]:
    """One line's arrival, input tokens and block ids, or an error naming what is wrong."""
    try:
        row = json.loads(text)
    except (ValueError, RecursionError) as err:
        raise _refuse(path, number, f"not JSON ({err})", text) from None
    if not isinstance(row, dict):
        raise _refuse(path, number, "expected a JSON object", text)
    missing = [key for key in ("timestamp", "input_length", "hash_ids") if key not in row]
    if missing:
        raise _refuse(path, number, f"missing {', '.join(missing)}", text)
    stamp, length, ids = row["timestamp"], row["input_length"], row["hash_ids"]
    # NaN and infinities (json reads NaN, Infinity) fail the range test too.
    if not (_int(stamp) or isinstance(stamp, float)) or not 0 <= stamp <= _MAX_TIMESTAMP:
        what = f"timestamp must be a number of ms in 0..{_MAX_TIMESTAMP}"
        raise _refuse(path, number, what, stamp)
    if not _int(length) or not 1 <= length <= MAX_INPUT_TOKENS:
        what = f"input_length must be an integer in 1..{MAX_INPUT_TOKENS}"
        raise _refuse(path, number, what, length)
    blocks = -(-length // block_tokens)
    if not isinstance(ids, list) or not all(_int(i) and 0 <= i <= _MAX_ID for i in ids):
        raise _refuse(path, number, "hash_ids must be a list of integers in 0..2**63-1", ids)
    if len(ids) > blocks:
        what = (
            f"{len(ids)} hash_ids for input_length {length}, more than its {blocks} blocks of "
            f"{block_tokens} tokens (is --block-tokens the trace's block size? Mooncake's is 512)"
        )
        raise _refuse(path, number, what, ids)
    return float(stamp), length, ids


def read_trace(path: str | Path, block_tokens: int = 512) -> Trace:
    """Read and check a trace; ArgumentError names the file, the line and the rule broken."""
    if not _int(block_tokens) or not 1 <= block_tokens <= MAX_BLOCK_TOKENS:
        message = (
            f"--block-tokens must be an integer in 1..{MAX_BLOCK_TOKENS}; got "
            f"{shorten(block_tokens)}"
        )
        raise ArgumentError(message)
    name = str(path)
    timestamps, inputs = array("d"), array("q")
    starts, ids = array("q", [0]), array("q")
    try:
        raw = open_regular(path)
    except FileRefused as err:
        raise ArgumentError(f"--trace {name}: cannot read it: {err.reason}") from None
    opener = _OPENERS.get(Path(name).suffix, _plain)
    with raw, opener(raw, "rt", encoding="utf-8") as handle:
        read = 0
        try:
            for number, text in enumerate(iter(lambda: handle.readline(_MAX_LINE + 1), ""), 1):
                read += len(text)
                if number > MAX_LINES or read > MAX_TRACE_CHARS:
                    message = (
                        f"trace {name} line {number}: more than {MAX_LINES} lines or "
                        f"{MAX_TRACE_CHARS} characters, the most read from a trace; replay a "
                        "part of it (split the file)"
                    )
                    raise ArgumentError(message)
                if len(text) > _MAX_LINE:
                    what = f"a line longer than {_MAX_LINE} characters"
                    raise _refuse(name, number, what, text[:80])
                if not text.strip():
                    continue
                stamp, length, blocks = _request(name, number, text, block_tokens)
                if timestamps and stamp < timestamps[-1]:
                    what = f"timestamp earlier than the previous request's {timestamps[-1]:g}"
                    raise _refuse(name, number, what + " (sort the trace by timestamp)", stamp)
                if len(ids) + len(blocks) > MAX_REFERENCES:
                    message = (
                        f"trace {name} line {number}: more than {MAX_REFERENCES} block references "
                        "in all, the most a trace may hold; replay a part of it (split the file)"
                    )
                    raise ArgumentError(message)
                timestamps.append(stamp)
                inputs.append(length)
                ids.extend(blocks)
                starts.append(len(ids))
        except UnicodeDecodeError as err:
            raise ArgumentError(f"trace {name}: not UTF-8 text ({err.reason})") from None
        except (OSError, EOFError, lzma.LZMAError) as err:  # gzip and xz report corruption so
            reason = getattr(err, "strerror", None) or err or type(err).__name__
            raise ArgumentError(f"trace {name}: cannot read it: {reason}") from None
    if not inputs:
        raise ArgumentError(f"trace {name} holds no request: expected one JSON object per line")
    return Trace(name, block_tokens, timestamps, inputs, starts, ids)
