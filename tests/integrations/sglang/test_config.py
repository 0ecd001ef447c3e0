"""The SGLang backend's parts that need no SGLang: extra_config, pool geometry, key namespaces."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import pytest

from kvcr_policy.config.order import extra_positional_types
from kvcr_policy.errors import ConfigError, PoolError
from kvcr_policy.geometry import opaque
from kvcr_policy.integrations.sglang.config import parse_extra_config
from kvcr_policy.integrations.sglang.pools import geometry_of, namespace_for
from tests.support.commands import run_main

LOADER = {"backend_name": "kvcr_policy", "module_path": "m", "class_name": "C"}


def test_own_keys_are_read_and_sglang_keys_tolerated() -> None:
    extra = {
        **LOADER,
        "interface_v1": 1,
        "prefetch_threshold": 256,
        "prefetch_timeout_base": 1,
        "tp_lcm_size": 4,
        "allocator": "default",
        "hicache_storage_pass_prefix_keys": True,
        "profile": "throughput",
        "overrides": {"batching.read_batch_pages": 64},
    }
    options = parse_extra_config(extra, {})
    assert options.profile == "throughput" and options.interface_v1
    assert options.overrides == {"batching.read_batch_pages": 64}
    assert "--hicache-storage-backend-extra-config" in options.profile_origin
    assert not parse_extra_config(None).interface_v1


def test_kwargs_win_over_extra_config_but_take_only_our_keys() -> None:
    options = parse_extra_config({"profile": "default"}, {"profile": "throughput"})
    assert options.profile == "throughput" and "kwargs" in options.profile_origin
    with pytest.raises(ConfigError, match="unknown key"):
        parse_extra_config({}, {"interface_v1": 1})


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_extra_config({"profil": "x", "profile": 3, "overrides": "a=b", "zzz": 1})
    issues = {issue.path: issue for issue in caught.value.issues}
    assert set(issues) == {
        "extra_config.profil",
        "extra_config.profile",
        "extra_config.overrides",
        "extra_config.zzz",
    }
    assert "did you mean 'profile'" in issues["extra_config.profil"].message
    assert "backend_name" in issues["extra_config.zzz"].message
    with pytest.raises(ConfigError, match="expected a JSON object"):
        parse_extra_config(["profile"])  # type: ignore[arg-type]


def _mha(**changes: Any) -> SimpleNamespace:
    values: dict[str, Any] = dict(
        layout="page_head", layer_num=2, head_num=2, head_dim=8, v_head_dim=8,
        dtype="torch.bfloat16", page_size=4, size=32, kv_buffer=None,
    )  # fmt: skip
    values.update(changes)
    if values["kv_buffer"] is None:
        values["kv_buffer"] = SimpleNamespace(data_ptr=lambda: 0, device="cpu")
    return SimpleNamespace(**values)


def test_geometry_of_an_mha_and_an_mla_host_pool() -> None:
    geometry = geometry_of(_mha(), "kv")
    assert (geometry.layout, geometry.layers, geometry.heads, geometry.head_dim) == (
        "page_head", 2, 2, 8,
    )  # fmt: skip
    assert (geometry.dtype, geometry.page_size, geometry.tokens, geometry.mla) == (
        "bfloat16", 4, 32, False,
    )  # fmt: skip
    mla = geometry_of(_mha(layout="page_first", kv_cache_dim=24), "kv")
    assert (mla.mla, mla.heads, mla.head_dim) == (True, 1, 24)


# Mamba, DCP, page_unified and asymmetric K/V pools are refused by real SGLang classes in
# test_storage.py. Faked here only what SGLang 0.5.23 cannot build on this machine: a
# page-envelope pool (UnifiedPageEnvelopeHostPool mirrors a unified-memory device pool: a
# GPU), an MLA pool in ``page_head`` (SGLang has no such layout for MLA; the check guards a
# release that would), and a pool whose single kv_buffer says V is wider than K (SGLang keeps
# those in two buffers; the check guards a release that would not).
@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"stores_page_envelope": True}, "page-envelope"),
        ({"layout": "page_head", "kv_cache_dim": 24}, "layout"),
        ({"v_head_dim": 16}, "V head dim 16"),
    ],
)
def test_pools_sglang_cannot_build_here_are_refused(changes: dict[str, Any], reason: str) -> None:
    with pytest.raises(PoolError, match=reason):
        geometry_of(_mha(**changes), "kv")


def _config(**changes: Any) -> SimpleNamespace:
    values: dict[str, Any] = dict(
        model_name="m", tp_rank=0, tp_size=2, pp_rank=0, pp_size=1, attn_cp_rank=0,
        attn_cp_size=1, dp_rank=0, is_mla_model=False, dcp_size=1, dcp_rank=0,
    )  # fmt: skip
    values.update(changes)
    return SimpleNamespace(**values)


def test_namespaces_separate_ranks_pools_and_formats() -> None:
    geometry = opaque("kv", 64, 4)
    digest = geometry.digest()
    base = namespace_for(_config(), "kv", digest)
    assert base.keys(["a"]) == [base.prefix + "a"] and base.prefix.endswith(":")
    assert "tp=0/2" in base.label and f"geometry={geometry.digest()}" in base.label
    others = [
        namespace_for(_config(tp_rank=1), "kv", digest),
        namespace_for(_config(dp_rank=3), "kv", digest),
        namespace_for(_config(), "swa", digest),
        namespace_for(_config(), "kv", opaque("kv", 128, 4).digest()),
        namespace_for(_config(), "kv", digest, format_tag="mxfp8"),
    ]
    assert len({base.prefix, *(n.prefix for n in others)}) == 1 + len(others)
    ranks = [_config(is_mla_model=True, tp_rank=r) for r in (0, 1)]
    mla = [namespace_for(config, "kv", digest) for config in ranks]
    assert mla[0].prefix == mla[1].prefix and "tp=replicated" in mla[0].label
    mamba = [namespace_for(config, "mamba", digest) for config in ranks]
    assert mamba[0].prefix != mamba[1].prefix  # Mamba state is TP-sharded even for MLA


def test_names_holding_the_label_separators_never_share_a_namespace() -> None:
    """The label joins its parts with ';' and '=': a pool or model name holding them once gave
    two pools one label (and so one key prefix); the free-text parts are percent-encoded."""
    forged = namespace_for(_config(), "kv;geometry=x", "y")
    honest = namespace_for(_config(), "kv", "x;geometry=y")
    assert forged.label != honest.label and forged.prefix != honest.prefix
    model = namespace_for(_config(model_name="a;tp=1/2"), "kv", "g")
    assert "model=a%3Btp%3D1/2;" in model.label
    usual = namespace_for(_config(model_name="Qwen/Qwen3-32B"), "kv", "g")
    assert usual.label.startswith("model=Qwen/Qwen3-32B;") and ";pool=kv;" in usual.label


def test_constructor_signature_is_pinned_without_importing_sglang() -> None:
    assert extra_positional_types() == {"KVCRPolicyStorage.__init__": ["storage_config", "kwargs"]}


def test_import_without_sglang_names_the_install_command() -> None:
    code = (
        "import sys; sys.modules['sglang'] = None\n"
        "try:\n"
        "    from kvcr_policy.integrations.sglang import KVCRPolicyStorage\n"
        "except ImportError as err:\n"
        "    print(err)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert "needs SGLang 0.5.23" in out
    assert "bash .ci/install-sglang.sh" in out and "-e '.[sglang]'" in out


def test_overrides_may_be_json_text_or_a_file_and_each_value_names_its_key(
    tmp_path: Any,
) -> None:
    from kvcr_policy.integrations.sglang.config import override_origins

    text = parse_extra_config({**LOADER, "overrides": '{"batching": {"read_batch_pages": 64}}'})
    assert text.overrides == {"batching": {"read_batch_pages": 64}}
    flag = "SGLang --hicache-storage-backend-extra-config"
    assert override_origins(text) == {
        "batching.read_batch_pages": f"{flag} ['overrides']['batching']['read_batch_pages']"
    }
    path = tmp_path / "overrides.toml"
    path.write_text('"placement.capacity_bytes" = "64GiB"\n')
    from_file = parse_extra_config({**LOADER, "overrides": f"@{path}"})
    assert from_file.overrides == {"placement.capacity_bytes": "64GiB"}
    assert override_origins(from_file) == {
        "placement.capacity_bytes": f"{flag} ['overrides'] @{path} ['placement.capacity_bytes']"
    }


def test_bad_overrides_text_and_unreadable_files_are_one_message_each() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_extra_config(
            {**LOADER, "overrides": '{"batching.read_batch_pages": 64', "profil": "x"}
        )
    text = str(caught.value)
    assert "2 problems" in text
    assert "extra_config.overrides (from SGLang --hicache-storage-backend-extra-config)" in text
    assert "not valid JSON" in text and "did you mean 'profile'" in text
    with pytest.raises(ConfigError, match="cannot read the file"):
        parse_extra_config({**LOADER, "overrides": "@/nonexistent/overrides.toml"})


def _alias_bomb(levels: int, width: int = 2) -> str:
    """YAML of ``levels`` mappings, each holding the level below ``width`` times through
    aliases: a few KiB that hold width**levels leaves (the red team's had 2**30)."""
    lines = ["l0: &l0 {x: 1, y: 1}"]
    for i in range(1, levels + 1):
        refs = ", ".join(f"k{j}: *l{i - 1}" for j in range(width))
        lines.append(f"l{i}: &l{i} {{{refs}}}")
    return "\n".join(lines) + f"\nplacement: *l{levels}\n"


@pytest.mark.parametrize(
    ("levels", "width", "says"),
    [(30, 2, "nested deeper than 16 levels"), (12, 4, "more than 4096 values")],
    ids=["deep", "wide"],
)
def test_overrides_that_would_take_unbounded_work_are_one_message(
    tmp_path: Any, levels: int, width: int, says: str
) -> None:
    """Red team 2026-12-c, C7: the provenance walk visited 2**30 leaves of a 2 KiB file."""
    path = tmp_path / "bomb.yaml"
    path.write_text(_alias_bomb(levels, width))
    assert path.stat().st_size < 4096
    with pytest.raises(ConfigError, match=says) as caught:
        parse_extra_config({**LOADER, "overrides": f"@{path}"})
    assert len(caught.value.issues) == 1


def test_many_overrides_or_unknown_keys_are_bounded() -> None:
    many = {f"batching.k{i}": 1 for i in range(10**5)}
    with pytest.raises(ConfigError, match="more than 4096 values") as caught:
        parse_extra_config({**LOADER, "overrides": many})
    assert len(caught.value.issues) == 1
    with pytest.raises(ConfigError) as caught:
        parse_extra_config({**LOADER, **{f"key{i}": 1 for i in range(10**4)}})
    issues = caught.value.issues
    assert len(issues) == 33 and issues[-1].message.startswith("and 9968 more unknown keys")


@pytest.mark.sglang
def test_sglangs_factory_builds_the_backend_from_that_json(
    sg: SimpleNamespace, storage_config: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    _, out, _ = run_main(capsys, "sglang-config", "--set", "placement.capacity_bytes=64MiB")
    backend = sg.StorageBackendFactory.create_backend(
        "dynamic", storage_config(json.loads(out)), None
    )
    try:
        assert type(backend).__name__ == "KVCRPolicyStorage"
        assert backend.loaded.config.placement.capacity_bytes == 64 << 20
    finally:
        backend.close()
