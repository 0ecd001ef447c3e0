"""The SGLang controller replay reads the trace the repository bundles, compressed as it is
(``data/traces/conversation_trace.jsonl.xz``): it runs on a machine that has only the
repository."""

from __future__ import annotations

import lzma
from pathlib import Path

from tests.integrations.sglang.replay_stack import TRACE, read_requests
from tests.support.paths import ROOT


def test_the_default_trace_is_the_bundled_one() -> None:
    assert TRACE.is_relative_to(ROOT) and TRACE.is_file(), TRACE
    assert TRACE.suffix == ".xz"


def test_the_bundled_xz_trace_reads_as_requests() -> None:
    requests = read_requests(TRACE, 200)
    assert len(requests) == 200
    assert all(isinstance(r["hash_ids"], list) and r["hash_ids"] for r in requests)
    stamps = [r["timestamp"] for r in requests]
    assert stamps == sorted(stamps)


def test_a_plain_trace_reads_the_same_requests(tmp_path: Path) -> None:
    plain = tmp_path / "trace.jsonl"
    with lzma.open(TRACE, "rt", encoding="utf-8") as source:
        plain.write_text("".join(next(source) for _ in range(5)), encoding="utf-8")
    assert read_requests(plain, 5) == read_requests(TRACE, 5)
