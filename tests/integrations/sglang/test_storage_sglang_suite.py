"""SGLang's own storage-backend test, imported from the installed wheel and run against us.

``sglang/srt/mem_cache/storage/mooncake_store/test_mooncake_store.py`` (sglang 0.5.23) checks a
backend with SGLang's own mock host pool (``kv_buffer``, ``layout``, ``page_size`` and
``get_page_buffer_meta``, nothing else): the pointer form of the tensor API (``set`` and ``get``
with ``target_location`` and ``target_sizes``), ``exists``, and ``batch_set_v1`` /
``batch_exists`` / ``batch_get_v1`` over MHA and MLA configurations and TP ranks. The module is
used unchanged; only configuration differs: its ``MooncakeStore(config)`` is replaced by SGLang's
own ``StorageBackendFactory.create_backend("dynamic", config, None)`` with an ``extra_config``
that names this backend and the tier. Its assertions run as they are, on every tier.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Iterator
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from tests.integrations.conftest import dynamic_extra

pytestmark = pytest.mark.sglang

MODULE = "sglang.srt.mem_cache.storage.mooncake_store.test_mooncake_store"

#: The configurations of the module's ``__main__`` block, in its order: (MLA, TP rank, size).
BATCH_CONFIGS = [(False, 0, 1), (True, 0, 1), (False, 1, 4), (True, 3, 8)]


@pytest.fixture
def suite(
    sg: SimpleNamespace, tier_overrides: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> Iterator[ModuleType]:
    """SGLang's test module, its ``MooncakeStore`` built by SGLang's factory as our backend."""
    module = importlib.import_module(MODULE)
    made: list[Any] = []

    def store(config: Any) -> Any:
        extra = dynamic_extra(overrides=tier_overrides)
        backend = sg.StorageBackendFactory.create_backend(
            "dynamic", dataclasses.replace(config, extra_config=extra), None
        )
        made.append(backend)
        return backend

    monkeypatch.setattr(module, "MooncakeStore", store)
    yield module
    for backend in made:
        backend.close()


def test_single_operation(suite: ModuleType) -> None:
    suite.test_single_operation()


@pytest.mark.parametrize(("mla", "tp_rank", "tp_size"), BATCH_CONFIGS)
def test_batch_operation(suite: ModuleType, mla: bool, tp_rank: int, tp_size: int) -> None:
    config = suite.make_hicache_storage_config(is_mla_model=mla, tp_rank=tp_rank, tp_size=tp_size)
    suite.test_batch_operation(config)
