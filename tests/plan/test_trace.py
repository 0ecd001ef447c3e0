"""Reading a request trace: Mooncake's two traces as docs/plan.md describes them, and every
malformed line refused with its line number, what was expected and what was found."""

from __future__ import annotations

import gzip
import hashlib
import json
import lzma
from pathlib import Path

import pytest

from kvcr_policy.errors import ArgumentError
from kvcr_policy.plan import trace as trace_module
from kvcr_policy.plan.trace import MAX_BLOCK_TOKENS, read_trace
from tests.support.paths import ROOT

TRACES = ROOT / "data" / "traces"
GOOD = '{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]}'


def _write(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("name", "requests", "references", "distinct", "tokens", "sha256"),
    [
        (
            "conversation_trace.jsonl.xz",
            *(12031, 288500, 182790, 144793823),
            "b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df",
        ),
        (
            "synthetic_trace.jsonl.xz",
            *(3993, 121877, 43924, 61194628),
            "bd070915a98fc0ed264d7cfef2ce746002eb3076a695ec31ba2674c0111ec131",
        ),
    ],
)
def test_the_mooncake_traces_read_as_their_readme_says(
    name: str, requests: int, references: int, distinct: int, tokens: int, sha256: str
) -> None:
    text = lzma.decompress((TRACES / name).read_bytes())
    assert hashlib.sha256(text).hexdigest() == sha256  # unchanged from Mooncake's release
    trace = read_trace(TRACES / name)
    assert (trace.requests, trace.references, len(set(trace.ids))) == (
        requests,
        references,
        distinct,
    )
    assert trace.input_tokens == tokens
    first = json.loads(text.splitlines()[0])
    assert trace.blocks(0) == first["hash_ids"] and trace.inputs[0] == first["input_length"]


def test_gzip_and_plain_read_alike(tmp_path: Path) -> None:
    plain = _write(tmp_path, GOOD, GOOD)
    packed = tmp_path / "trace.jsonl.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert read_trace(packed).ids == read_trace(plain).ids


@pytest.mark.parametrize("suffix", [".gz", ".xz"])
def test_a_corrupt_compressed_trace_is_refused(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"trace.jsonl{suffix}"
    path.write_bytes(b"not compressed at all")
    with pytest.raises(ArgumentError, match=f"trace {path}: cannot read it"):
        read_trace(path)


def test_head_keeps_the_first_requests(tmp_path: Path) -> None:
    later = GOOD.replace('"timestamp": 0', '"timestamp": 5').replace("[1, 2]", "[1, 3]")
    trace = read_trace(_write(tmp_path, GOOD, later, later))
    head = trace.head(2)
    assert head.requests == 2 and head.blocks(1) == [1, 3] and head.references == 4
    assert head.duration_s == 0.005
    assert trace.head(99).requests == 3


def test_blank_lines_and_unknown_keys_are_fine(tmp_path: Path) -> None:
    extra = GOOD.replace("}", ', "model": "x"}')
    trace = read_trace(_write(tmp_path, GOOD, "", "   ", extra))
    assert trace.requests == 2


@pytest.mark.parametrize(
    ("line", "what"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"timestamp": 0, "input_length": 5}', "missing hash_ids"),
        (GOOD.replace('"timestamp": 0', '"timestamp": -1'), "timestamp must be a number"),
        (GOOD.replace('"timestamp": 0', '"timestamp": NaN'), "timestamp must be a number"),
        (GOOD.replace('"timestamp": 0', '"timestamp": Infinity'), "timestamp must be a number"),
        (GOOD.replace('"timestamp": 0', '"timestamp": "0"'), "timestamp must be a number"),
        (GOOD.replace('"timestamp": 0', '"timestamp": 1e300'), "timestamp must be a number"),
        (GOOD.replace("600", "0"), "input_length must be an integer in 1.."),
        (GOOD.replace("600", "600.5"), "input_length must be an integer"),
        (GOOD.replace("600", "true"), "input_length must be an integer"),
        (GOOD.replace("600", "99999999999"), "input_length must be an integer"),
        (GOOD.replace("[1, 2]", "[1, -2]"), "hash_ids must be a list of integers"),
        (GOOD.replace("[1, 2]", "[1, 9223372036854775808]"), "hash_ids must be a list"),
        (GOOD.replace("[1, 2]", "[1, false]"), "hash_ids must be a list"),
        (GOOD.replace("[1, 2]", '"1,2"'), "hash_ids must be a list"),
        (GOOD.replace("[1, 2]", "[1, 2, 3]"), "3 hash_ids for input_length 600, more than its 2"),
    ],
)
def test_a_malformed_line_is_refused_with_its_number(tmp_path: Path, line: str, what: str) -> None:
    path = _write(tmp_path, GOOD, GOOD, line)
    with pytest.raises(ArgumentError, match=f"trace {path} line 3: ") as caught:
        read_trace(path)
    assert what in str(caught.value)


def test_requests_out_of_arrival_order_are_refused(tmp_path: Path) -> None:
    late = GOOD.replace('"timestamp": 0', '"timestamp": 9')
    with pytest.raises(ArgumentError, match=r"line 2: timestamp earlier than .*sort the trace"):
        read_trace(_write(tmp_path, late, GOOD))


def test_a_wrong_block_size_is_caught_on_the_first_line(tmp_path: Path) -> None:
    with pytest.raises(ArgumentError, match=r"line 1: .*is --block-tokens the trace's block size"):
        read_trace(_write(tmp_path, GOOD), block_tokens=1024)


@pytest.mark.parametrize("block_tokens", [0, -5, MAX_BLOCK_TOKENS + 1, True])
def test_block_sizes_out_of_bounds_are_refused(tmp_path: Path, block_tokens: int) -> None:
    with pytest.raises(
        ArgumentError, match=f"--block-tokens must be an integer in 1..{MAX_BLOCK_TOKENS}"
    ):
        read_trace(_write(tmp_path, GOOD), block_tokens=block_tokens)


def test_too_many_references_are_refused_not_held(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(trace_module, "MAX_REFERENCES", 3)
    with pytest.raises(ArgumentError, match="line 2: more than 3 block references"):
        read_trace(_write(tmp_path, GOOD, GOOD))


@pytest.mark.parametrize(
    ("bound", "value", "lines"),
    [("MAX_LINES", 1000, 1001), ("MAX_TRACE_CHARS", 10_000, 300)],
)
def test_a_trace_past_its_lines_or_characters_stops_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bound: str, value: int, lines: int
) -> None:
    """Requests without blocks cost no reference, blank lines nothing at all: the lines and the
    characters read are bounded too (red team 2026-12-c, C9: a 17 MiB gzip of empty requests
    inflated to 120 M of them). A gzip of ten times more is refused at the bound."""
    monkeypatch.setattr(trace_module, bound, value)
    empty = b'{"timestamp": 0, "input_length": 1, "hash_ids": []}\n'
    for row in (empty, b"\n" * 5):
        path = tmp_path / "bomb.jsonl.gz"
        path.write_bytes(gzip.compress(row * lines * 10))
        seen: list[int] = []
        monkeypatch.setattr(trace_module, "_request", _counting(seen, trace_module._request))
        with pytest.raises(ArgumentError, match="the most read from a trace"):
            read_trace(path)
        assert len(seen) <= lines


def _counting(seen: list[int], real: object) -> object:
    def counted(*args: object) -> object:
        seen.append(1)
        return real(*args)  # type: ignore[operator]

    return counted


def test_an_overlong_line_is_refused_without_reading_it_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(trace_module, "_MAX_LINE", 60)
    short = '{"timestamp":0,"input_length":1,"hash_ids":[]}'
    with pytest.raises(ArgumentError, match="line 2: a line longer than 60 characters"):
        read_trace(_write(tmp_path, short, GOOD))


@pytest.mark.parametrize(
    ("content", "what"),
    [(b"", "holds no request"), (b"\xff\xfe{}", "not UTF-8 text")],
)
def test_an_empty_or_binary_file_is_refused(tmp_path: Path, content: bytes, what: str) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_bytes(content)
    with pytest.raises(ArgumentError, match=what):
        read_trace(path)


def test_a_missing_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ArgumentError, match=r"--trace .*missing.jsonl: cannot read it"):
        read_trace(tmp_path / "missing.jsonl")
