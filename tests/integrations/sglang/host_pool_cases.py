"""What the backend must do with every host pool class of SGLang 0.5.23 (``host_pools.py``
builds them): move it (``zero-copy``, ``pointers``, ``tensors``, ``logical``; see
``kvcr_policy/integrations/sglang/bindings.py``) or refuse it (``refused``, with a part of the
reason). The host-pool table of docs/sglang.md lists the same classes and verdicts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from tests.integrations.conftest import mha_pool, mla_pool
from tests.integrations.sglang.host_pools import (
    dsv4_paged,
    dsv4_state,
    envelope,
    hisparse,
    interleave,
    k_only,
    logical,
    mamba,
    minimax_index,
    minimax_main,
    mla_dsa,
    mxfp8,
    qsa,
)

LAYOUTS = ["layer_first", "page_first", "page_first_direct"]


@dataclass(frozen=True)
class Case:
    """One class in one layout: its builder, the pool name it registers under, the verdict."""

    cls: str
    layout: str
    build: Callable[[SimpleNamespace], Any]
    expect: str  # zero-copy | pointers | tensors | logical | refused
    reason: str = ""  # a part of the refusal (refused only)
    pool: str = "kv"
    fields: dict[str, Any] = field(default_factory=dict)  # HiCacheStorageConfig fields
    note: str = ""

    @property
    def id(self) -> str:
        return f"{self.cls}-{self.layout}"


MHA = "MHATokenToKVPoolHost"
MLA = "MLATokenToKVPoolHost"


def _cases() -> list[Case]:
    cases = [
        Case(MHA, layout, lambda sg, lo=layout: mha_pool(sg, lo), "zero-copy")
        for layout in [*LAYOUTS, "page_head"]
    ]
    cases.append(Case(MHA, "page_unified", lambda sg: mha_pool(sg, "page_unified"), "zero-copy"))
    cases += [
        Case(
            MLA,
            layout,
            lambda sg, lo=layout: mla_pool(sg, lo),
            "zero-copy",
            fields={"is_mla_model": True},
        )
        for layout in [*LAYOUTS, "page_unified"]
    ]
    cases.append(
        Case(
            MLA,
            "page_first (DCP 2)",
            lambda sg: mla_pool(sg, "page_first", dcp_size=2),
            "pointers",
            fields={"is_mla_model": True},
        )
    )
    cases += [
        Case(
            "AsymmetricMHATokenToKVPoolHost",
            layout,
            lambda sg, lo=layout: mha_pool(sg, lo, v_head_dim=8),
            "pointers",
        )
        for layout in ["page_first", "page_first_direct"]
    ]
    cases += [
        Case(
            "MHATokenToKOnlyPoolHost",
            layout,
            lambda sg, lo=layout: k_only(sg, lo),
            "tensors" if layout == "layer_first" else "pointers",
            pool="indexer",
        )
        for layout in LAYOUTS
    ]
    cases.append(
        Case(
            "HiSparseMHATokenToKVPoolHost",
            "layer_first",
            lambda sg: hisparse(sg, "layer_first"),
            "pointers",
            note="cudaHostRegister skipped",
        )
    )
    cases.append(
        Case(
            "MHATokenToKVPoolMXFP8Host",
            "page_first",
            lambda sg: mxfp8(sg, "page_first"),
            "refused",
            reason="scales live outside kv_buffer",
            note="built without __init__",
        )
    )
    cases += [
        Case(
            "DSAIndexerPoolHost",
            layout,
            lambda sg, lo=layout: mla_dsa(sg, lo, indexer=True),
            "tensors" if layout == "layer_first" else "pointers",
            pool="indexer",
            fields={"is_mla_model": True},
        )
        for layout in LAYOUTS
    ]
    cases.append(
        Case(
            MLA,
            "page_first (DSA anchor)",
            lambda sg: mla_dsa(sg, "page_first", indexer=False),
            "zero-copy",
            fields={"is_mla_model": True},
        )
    )
    cases += [
        Case(
            "QSAIndexerPoolHost",
            layout,
            lambda sg, lo=layout: qsa(sg, lo),
            "pointers",
            pool="indexer",
            note="device pool stand-in",
        )
        for layout in LAYOUTS
    ]
    cases += [
        Case(
            "DeepSeekV4PagedHostPool",
            layout,
            lambda sg, lo=layout: dsv4_paged(sg, lo),
            "pointers",
            pool="deepseek_v4_c4",
            fields={"is_mla_model": True},
        )
        for layout in LAYOUTS
    ]
    cases += [
        Case(
            "DeepSeekV4StateHostPool",
            layout,
            lambda sg, lo=layout: dsv4_state(sg, lo),
            "pointers",
            pool="deepseek_v4_c4_state",
            fields={"is_mla_model": True},
        )
        for layout in LAYOUTS
    ]
    cases.append(
        Case(
            "LogicalHostPool",
            "layer_first",
            lambda sg: logical(sg, "layer_first"),
            "logical",
            fields={"is_mla_model": True},
        )
    )
    cases += [
        Case(
            f"MiniMaxM3Nvfp4{kind}PoolHost",
            layout,
            lambda sg, lo=layout, b=build: b(sg, lo),
            "tensors" if layout == "layer_first" else "pointers",
            pool="kv" if kind == "MainKV" else "indexer",
        )
        for kind, build in (("MainKV", minimax_main), ("IndexK", minimax_index))
        for layout in LAYOUTS
    ]
    cases.append(
        Case(
            "MambaPoolHost",
            "page_first",
            lambda sg: mamba(sg, "page_first"),
            "pointers",
            pool="mamba",
        )
    )
    cases.append(
        Case(
            "UnifiedPageEnvelopeHostPool",
            "page_first",
            lambda sg: envelope(sg, "page_first"),
            "refused",
            reason="overwrite bytes another pool owns",
        )
    )
    cases.append(
        Case(
            "PageInterleaveHostPool",
            "page_first",
            lambda sg: interleave(sg, "page_first"),
            "refused",
            reason="dealt round-robin over 2 ranks",
        )
    )
    return cases


CASES = _cases()
