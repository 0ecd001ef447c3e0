"""The generic path on SGLang's own test pool (``test_mooncake_store``'s mock: a buffer and
``get_page_buffer_meta``, nothing else): pointers outside the pool and pages that change shape
move nothing; stores and restores run side by side."""

from __future__ import annotations

import importlib
import threading
from types import SimpleNamespace
from typing import Any

import pytest

pytestmark = pytest.mark.sglang


@pytest.fixture
def mock(sg: SimpleNamespace, make_backend: Any) -> Any:
    suite = importlib.import_module(
        "sglang.srt.mem_cache.storage.mooncake_store.test_mooncake_store"
    )
    pool, buffer = suite.create_mock_host_kv_cache(4096, entries_per_page=2, page_elements=16)
    backend = make_backend()
    backend.register_mem_pool_host(pool)
    assert backend.pools["kv"].kind == "pointers"
    return SimpleNamespace(pool=pool, buffer=buffer, backend=backend, torch=sg.torch)


def test_an_index_past_the_pool_moves_nothing(mock: Any) -> None:
    torch, backend = mock.torch, mock.backend
    pages = 4096 // 32
    assert backend.batch_set_v1(["a", "b"], torch.tensor([pages - 1, pages])) == [False, False]
    assert backend.batch_set_v1(["a"], torch.tensor([0])) == [True]
    before = mock.buffer.clone()
    assert backend.batch_get_v1(["a"], torch.tensor([pages + 3])) == [False]
    assert torch.equal(mock.buffer, before)


def test_pages_that_change_shape_after_registration_move_nothing(mock: Any) -> None:
    torch, backend = mock.torch, mock.backend
    assert backend.batch_set_v1(["a"], torch.tensor([1])) == [True]
    mock.pool.entries_per_page = 3  # a page now lists three pieces
    before = mock.buffer.clone()
    assert backend.batch_get_v1(["a"], torch.tensor([2])) == [False]
    assert backend.batch_set_v1(["b"], torch.tensor([2])) == [False]
    assert torch.equal(mock.buffer, before)


def test_stores_and_restores_run_side_by_side_byte_exact(mock: Any) -> None:
    torch, backend = mock.torch, mock.backend
    page = mock.buffer.view(-1, 32)  # 2 entries of 16 float32 per page
    keys = [f"k{i}" for i in range(40)]
    assert backend.batch_set_v1(keys, torch.arange(40)) == [True] * 40
    expected = page[:40].clone()
    failures: list[str] = []

    def restore(offset: int) -> None:
        for _ in range(5):
            got = backend.batch_get_v1(keys, torch.arange(40) + offset)
            if got != [True] * 40 or not torch.equal(page[offset : offset + 40], expected):
                failures.append(f"restore at {offset}")

    def store() -> None:
        for round_ in range(5):
            names = [f"s{round_}-{i}" for i in range(40)]
            if backend.batch_set_v1(names, torch.arange(40)) != [True] * 40:
                failures.append("store")

    threads = [threading.Thread(target=restore, args=(40,)), threading.Thread(target=store)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not failures
