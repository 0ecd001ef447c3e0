"""Every host pool class of SGLang 0.5.23, built on the CPU, through our backend.

Each case (``host_pools.CASES``) is registered the way SGLang registers it (the KV anchor with
``register_mem_pool_host``, the others with ``register_mem_host_pool_v2``) and is either moved,
every restored page byte-exact as SGLang reads it, or refused with its reason while the pages of
that pool miss. The docs' host-pool table (docs/sglang.md) lists the same classes and verdicts.
"""

from __future__ import annotations

import random
import re
from types import SimpleNamespace
from typing import Any

import pytest

from tests.integrations.sglang.host_pool_cases import CASES, Case
from tests.integrations.sglang.host_pools import fill, page_bytes, token_indices
from tests.support.paths import ROOT

pytestmark = pytest.mark.sglang

PAGES = 3


def pages_of(pool: Any) -> int:
    count = getattr(pool, "page_num", None) or getattr(pool, "num_host_pages", None)
    return int(count or pool.size // pool.page_size)


def register(sg: SimpleNamespace, backend: Any, case: Case, pool: Any) -> None:
    if case.pool == "kv":
        backend.register_mem_pool_host(pool)
    backend.register_mem_host_pool_v2(pool, case.pool)


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_each_host_pool_is_moved_byte_exact_or_refused_with_its_reason(
    sg: SimpleNamespace, make_backend: Any, case: Case
) -> None:
    pool = case.build(sg)
    assert type(pool).__name__ == case.cls
    backend = make_backend(case.fields)
    register(sg, backend, case, pool)
    keys = [f"{case.id}-{i}" for i in range(PAGES)]
    if case.expect == "refused":
        assert case.pool not in backend.pools
        assert case.reason in backend.refused[case.pool]
        put = sg.hs.PoolTransfer(
            name=case.pool, host_indices=token_indices(sg, pool, [1]), keys=keys[:1]
        )
        assert backend.batch_set_v2([put]) == {case.pool: [False]}
        return
    binding = backend.pools[case.pool]
    assert binding.kind == case.expect, binding.description
    chosen = random.Random(case.id).sample(range(1, pages_of(pool)), 2 * PAGES)
    src, dst = chosen[:PAGES], chosen[PAGES:]
    fill(sg, pool, src, seed=11)
    fill(sg, pool, dst, seed=12)
    expected = [page_bytes(sg, pool, page) for page in src]
    put = sg.hs.PoolTransfer(name=case.pool, host_indices=token_indices(sg, pool, src), keys=keys)
    assert backend.batch_set_v2([put]) == {case.pool: [True] * PAGES}
    take = sg.hs.PoolTransfer(name=case.pool, host_indices=token_indices(sg, pool, dst), keys=keys)
    assert backend.batch_get_v2([take]) == {case.pool: [True] * PAGES}
    if case.expect != "logical":
        assert [page_bytes(sg, pool, page) for page in dst] == expected
        assert backend.batch_get_v2(
            [
                take,
            ]
        ) == {case.pool: [True] * PAGES}
        missing = sg.hs.PoolTransfer(
            name=case.pool,
            host_indices=token_indices(sg, pool, dst),
            keys=[f"absent-{i}" for i in range(PAGES)],
        )
        assert backend.batch_get_v2([missing]) == {case.pool: [False] * PAGES}


def test_a_host_pool_group_registers_its_anchor_and_every_member(
    sg: SimpleNamespace, make_backend: Any
) -> None:
    from sglang.srt.mem_cache.pool_host.group import HostPoolGroup, PoolEntry

    from tests.integrations.conftest import mha_pool
    from tests.integrations.sglang.host_pools import mamba

    kv, swa, state = (
        mha_pool(sg, "page_first"),
        mha_pool(sg, "layer_first"),
        mamba(sg, "page_first"),
    )
    group = HostPoolGroup(
        [
            PoolEntry(
                sg.hs.PoolName.KV, kv, None, lambda layer: layer, is_primary_index_anchor=True
            ),
            PoolEntry(sg.hs.PoolName.SWA, swa, None, lambda layer: layer),
            PoolEntry(sg.hs.PoolName.MAMBA, state, None, lambda layer: layer),
        ]
    )
    backend = make_backend()
    backend.register_mem_pool_host(group)
    assert {n: b.host_pool for n, b in backend.pools.items()} == {
        "kv": kv,
        "swa": swa,
        "mamba": state,
    }
    assert [backend.pools[n].kind for n in ("kv", "swa", "mamba")] == [
        "zero-copy",
        "zero-copy",
        "pointers",
    ]


def test_a_pool_without_a_page_description_is_refused_with_what_it_lacks(
    make_backend: Any,
) -> None:
    backend = make_backend()
    backend.register_mem_host_pool_v2(SimpleNamespace(layout="page_first", page_size=1), "swa")
    reason = backend.refused["swa"]
    assert "it has no get_page_buffer_meta()" in reason
    assert "it has no get_data_page()" in reason


def test_the_readme_table_lists_every_class_with_its_verdict() -> None:
    readme = (ROOT / "docs" / "sglang.md").read_text(encoding="utf-8")
    table = readme.split("## Host pools", 1)[1].split("\n## ", 1)[0]
    rows = {
        m.group(1): m.group(2)
        for m in re.finditer(r"^\| `(\w+)` \| [^|]* \| ([\w -]+?) \|", table, re.M)
    }
    expected: dict[str, set[str]] = {}
    for case in CASES:
        expected.setdefault(case.cls, set()).add(case.expect)
    for cls, verdicts in expected.items():
        assert cls in rows, f"docs/sglang.md's host-pool table has no row for {cls}"
        assert set(rows[cls].split(" or ")) == verdicts, (cls, rows[cls], verdicts)
