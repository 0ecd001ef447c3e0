"""The target pools: fill, poison and verify; the GPU checksum checked on host tensors.

This machine has no GPU, so the cuda target's pool and checksum run here on CPU tensors (the
same torch calls); ``test_bench_cuda.py`` runs them on a GPU where one is visible.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvcr_policy.bench.targets import GpuPool, HostPool, checksums, tokens_of, torch_checksums
from kvcr_policy.geometry import preset

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("layout", ["layer_first", "page_first", "page_head"])
def test_the_gpu_checksum_equals_the_host_checksum(layout: str) -> None:
    geometry = preset("small", layout=layout, tokens=64)  # type: ignore[arg-type]
    tensor = torch.empty(geometry.shape, dtype=torch.bfloat16)
    flat = tensor.view(-1).view(torch.uint8)
    flat.view(torch.int64).random_()
    view = flat.numpy().reshape(geometry.fragments_per_page, geometry.pages, -1)
    on_device = torch_checksums(torch, flat, geometry).numpy().view(np.uint64)
    assert np.array_equal(on_device, checksums(view))


def test_the_gpu_pool_verifies_only_what_was_filled() -> None:
    geometry = preset("small", layout="layer_first", tokens=64)
    pool = GpuPool(torch, geometry)  # a host tensor standing in for GPU memory
    pool.fill()
    assert pool.verify()
    saved = pool.tensor.clone()
    pool.poison()
    assert not pool.verify()
    pool.tensor.copy_(saved)
    assert pool.verify()


def test_the_host_pool_restores_into_its_second_half() -> None:
    geometry = preset("small", layout="page_first", tokens=64)
    pool = HostPool(geometry.with_tokens(128))
    assert pool.src_pages.tolist() == [0, 1, 2, 3] and pool.dst_pages.tolist() == [4, 5, 6, 7]
    pool.fill()
    pool.poison()
    assert not pool.verify()
    view = pool.tensor.view(-1).view(torch.uint8).numpy().reshape(2, 8, -1)
    view[:, 4:] = view[:, :4]  # a perfect restore
    assert pool.verify()
    view[1, 6, 5] ^= 1
    assert not pool.verify()


def test_tokens_of_pages() -> None:
    assert tokens_of(4, np.array([2, 0])).tolist() == [8, 9, 10, 11, 0, 1, 2, 3]
