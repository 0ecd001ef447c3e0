"""The tensor (v0) API in its pointer form: addresses checked, objects of any size and pieces."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

pytestmark = pytest.mark.sglang


@pytest.fixture
def pool_and_backend(sg: SimpleNamespace, kit: SimpleNamespace, make_backend: Any) -> Any:
    backend = make_backend()
    pool = kit.mha("page_first")
    backend.register_mem_pool_host(pool)
    return pool, backend


def test_an_object_of_two_pieces_round_trips_through_other_pieces(
    sg: SimpleNamespace, pool_and_backend: Any
) -> None:
    pool, backend = pool_and_backend
    flat = pool.kv_buffer.view(-1).view(sg.torch.uint8)
    base = flat.data_ptr()
    assert backend.set("two", target_location=[base, base + 4096], target_sizes=[100, 28])
    assert backend.exists("two") and not backend.exists("three")
    before = flat[:2000].clone()
    assert backend.get("two", target_location=[base + 1000, base + 1100], target_sizes=[100, 28])
    assert sg.torch.equal(flat[1000:1100], before[:100])
    assert sg.torch.equal(flat[1100:1128], flat[4096:4124])
    # The same 128 bytes as one tensor: one pool per object size, whatever the form.
    out = sg.torch.zeros(128, dtype=sg.torch.uint8)
    assert backend.get("two", out) is out and sg.torch.equal(out[:100], before[:100])


def test_addresses_outside_every_registered_pool_move_nothing(
    sg: SimpleNamespace, pool_and_backend: Any, make_backend: Any
) -> None:
    pool, backend = pool_and_backend
    stranger = sg.torch.arange(64, dtype=sg.torch.uint8)
    address = stranger.data_ptr()
    assert not backend.set("x", target_location=address, target_sizes=64)
    base = pool.kv_buffer.data_ptr()
    assert backend.set("x", target_location=base, target_sizes=64)
    assert not backend.get("x", target_location=address, target_sizes=64)
    assert sg.torch.equal(stranger, sg.torch.arange(64, dtype=sg.torch.uint8))  # untouched
    end = base + pool.kv_buffer.numel() * pool.kv_buffer.element_size()
    assert not backend.get("x", target_location=end - 32, target_sizes=64)  # runs past the end
    fresh = make_backend()  # no pool registered: no memory to point into
    assert not fresh.set("x", target_location=base, target_sizes=64)


def test_batch_get_in_pointer_form_counts_the_leading_keys_restored(
    pool_and_backend: Any,
) -> None:
    pool, backend = pool_and_backend
    base = pool.kv_buffer.data_ptr()
    assert backend.batch_set(["a", "b"], target_locations=[base, base + 64], target_sizes=[64, 64])
    targets = [base + 512, base + 576, base + 640]
    assert backend.batch_get(["a", "b", "c"], targets, [64, 64, 64]) == 2
    assert backend.batch_get(["c", "a"], targets[:2], [64, 64]) == 0
    assert not backend.batch_set(["d"], target_locations=[[base, base + 8]], target_sizes=[[8]])


def test_a_target_tensor_that_is_not_contiguous_is_a_miss(
    sg: SimpleNamespace, pool_and_backend: Any
) -> None:
    _, backend = pool_and_backend
    assert backend.set("t", sg.torch.arange(16, dtype=sg.torch.float32))
    strided = sg.torch.zeros(32, dtype=sg.torch.float32)[::2]
    assert backend.get("t", strided) is None
    assert backend.get("t", sg.torch.zeros(16, dtype=sg.torch.float32)).tolist() == list(range(16))


def test_pointers_and_sizes_near_2_63_are_misses_not_crashes(
    sg: SimpleNamespace, pool_and_backend: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """An address near 2**63 once wrapped the range check in int64 and the copy segfaulted; an
    int past int64 was a bare OverflowError, a huge size an allocation of that many bytes."""
    pool, backend = pool_and_backend
    base = pool.kv_buffer.data_ptr()
    assert backend.set("k32", target_location=base, target_sizes=32)
    top = (1 << 63) - 16
    assert not backend.get("k32", target_location=top, target_sizes=32)
    assert not backend.set("k33", target_location=top, target_sizes=32)
    assert not backend.get("k32", target_location=base, target_sizes=(1 << 63) - 1)
    assert not backend.get("k32", target_location=[base, base + 64], target_sizes=[16, top])
    assert not backend.get("k32", target_location=1 << 63, target_sizes=32)
    assert not backend.set("k34", target_location=1 << 64, target_sizes=32)
    assert not backend.get("k32", target_sizes=(1 << 63) - 1)  # no target: nothing allocated
    assert backend.get("k32", target_location=base + 4096, target_sizes=32)  # still served
    assert "Traceback" not in caplog.text
    assert all(r.exc_info is None for r in caplog.records)
