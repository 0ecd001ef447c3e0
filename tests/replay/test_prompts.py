"""The trace's requests as prompts: equal block ids give equal tokens, and lengths follow the
trace's input lengths at the replay's block size."""

from __future__ import annotations

from kvcr_policy.replay.prompts import prompts
from kvcr_policy.replay.setup import DEFAULT_TRACE
from tests.support.paths import ROOT


def test_equal_block_ids_give_equal_tokens() -> None:
    made = prompts(ROOT / DEFAULT_TRACE, 12, 32, 1024)
    assert len(made) == 12
    tokens_of: dict[int, tuple[int, ...]] = {}
    for p in made:
        assert 1 <= len(p.tokens) <= len(p.hash_ids) * 32
        for i, block in enumerate(p.hash_ids):
            piece = p.tokens[i * 32 : (i + 1) * 32]
            if len(piece) == 32:
                assert tokens_of.setdefault(block, piece) == piece
        assert all(3 <= t < 1024 for t in p.tokens)
    # Every request of the conversation trace starts with block 0.
    assert {p.hash_ids[0] for p in made} == {0}
