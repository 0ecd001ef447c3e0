"""The cascade through a real pipeline: DRAM in front of slot files. Pages leaving DRAM are
demoted (once admitted), disk hits are promoted, every restored byte is the stored one, and
what was demoted survives a restart."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import prometheus_client
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvcr_policy.config.loading import load_config
from kvcr_policy.pipeline import Pipeline, build_pipeline
from tests.support.pools import geometry, page_bytes, random_buffer, token_indices

GEO = geometry("page_first", pages=64)
DRAM_PAGES = 8


def _overrides(root: Path, **more: Any) -> dict[str, Any]:
    return {
        "backend.name": "cascade",
        "backend.options.file.path": str(root),
        "backend.options.file.capacity_bytes": 64 * GEO.page_bytes,
        "backend.options.file.min_free_bytes": 0,
        "placement.capacity_bytes": DRAM_PAGES * GEO.page_bytes,
        **more,
    }


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Any]:
    buffer = random_buffer(GEO, np.random.default_rng(3), "numpy-float16")
    reference = buffer.copy()
    opened: list[Pipeline] = []

    def open_(**more: Any) -> Pipeline:
        pipeline = build_pipeline(load_config(overrides=_overrides(tmp_path, **more)))
        pipeline.register_pool("kv", GEO, buffer)
        opened.append(pipeline)
        return pipeline

    yield open_, buffer, reference
    for pipeline in opened:
        pipeline.close()


def _set_in_fours(pipeline: Pipeline, keys: list[str]) -> None:
    for start in range(0, len(keys), 4):
        pages = range(start, min(start + 4, len(keys)))
        assert all(pipeline.set(keys[start : start + 4], token_indices(pages, 4)))


def _restored(pipeline: Pipeline, keys: list[str], buffer: Any, reference: Any) -> list[bool]:
    got = pipeline.get(keys, token_indices(range(32, 32 + len(keys)), 4))
    for i, ok in enumerate(got):
        if ok:
            assert page_bytes(buffer, GEO, 32 + i) == page_bytes(reference, GEO, i)
    return got


def _figures(pipeline: Pipeline) -> dict[str, Any]:
    figures: dict[str, Any] = pipeline.stats().to_dict()["pools"]["kv"]
    return figures


def test_pages_leaving_dram_are_demoted_and_disk_hits_promoted(rig: Any) -> None:
    open_, buffer, reference = rig
    pipeline = open_()
    keys = [f"k{i}" for i in range(24)]
    _set_in_fours(pipeline, keys)  # three times what DRAM holds
    assert pipeline.exists(keys) == 24
    figures = _figures(pipeline)
    assert figures["demoted"] == 16 and figures["dram"]["store"]["used"] == DRAM_PAGES
    assert _restored(pipeline, keys[:4], buffer, reference) == [True] * 4  # from disk
    figures = _figures(pipeline)
    assert figures["file_hits"] == 4 and figures["promoted"] == 4
    assert _restored(pipeline, keys[:4], buffer, reference) == [True] * 4  # now from DRAM
    assert _figures(pipeline)["dram_hits"] == 4
    assert _figures(pipeline)["file"]["read_bytes"] == 4 * GEO.page_bytes


def test_admission_on_the_second_hit_drops_pages_used_once(rig: Any) -> None:
    open_, buffer, reference = rig
    pipeline = open_(**{"backend.options.admit_hits": 2})
    hot = [f"hot{i}" for i in range(4)]
    _set_in_fours(pipeline, hot)
    assert _restored(pipeline, hot, buffer, reference) == [True] * 4  # a second use each
    cold = [f"cold{i}" for i in range(12)]
    _set_in_fours(pipeline, cold)  # pushes hot0..3 and cold0..3 out of DRAM
    assert pipeline.exists(hot) == 4  # demoted: used twice
    assert pipeline.exists(cold[:4]) == 0  # used once: dropped
    assert _figures(pipeline)["not_admitted"] == 4


def test_what_was_demoted_survives_a_restart(rig: Any) -> None:
    open_, buffer, reference = rig
    first = open_()
    keys = [f"k{i}" for i in range(16)]
    _set_in_fours(first, keys)
    first.close()
    second = open_()
    assert second.exists(keys[:8]) == 8  # the demoted half; DRAM's half died with it
    assert _restored(second, keys[:8], buffer, reference) == [True] * 8


def _levels(profile: str) -> dict[tuple[str, str], float]:
    """The cascade's per-level series of this pipeline's profile label, from the default
    registry as /metrics shows it (prometheus-client's own text format and parser)."""
    found: dict[tuple[str, str], float] = {}
    text = prometheus_client.generate_latest().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if labels.get("profile") == profile and "level" in labels:
                found[(sample.name, labels["level"])] = sample.value
    return found


def test_each_level_s_capacity_and_rate_in_stats_and_metrics(rig: Any, tmp_path: Path) -> None:
    _, buffer, reference = rig
    profile = tmp_path / f"levels{uuid.uuid4().hex[:8]}.toml"  # a label no other test uses
    profile.write_text("", encoding="utf-8")
    pipeline = build_pipeline(load_config(profile, overrides=_overrides(tmp_path / "t")))
    pipeline.register_pool("kv", GEO, buffer)
    keys = [f"k{i}" for i in range(16)]
    _set_in_fours(pipeline, keys)
    assert _restored(pipeline, keys[:4], buffer, reference) == [True] * 4  # from disk
    assert pipeline.get(keys[12:], token_indices(range(40, 44), 4)) == [True] * 4  # DRAM
    figures = _figures(pipeline)
    dram, disk = figures["dram"], figures["file"]
    assert dram["capacity_bytes"] == DRAM_PAGES * GEO.page_bytes
    assert disk["capacity_bytes"] == 64 * GEO.page_bytes
    assert dram["read_bytes"] == 4 * GEO.page_bytes == disk["read_bytes"]
    assert dram["read_gbps"] > 0 and disk["read_gbps"] > 0
    seen = _levels(profile.stem)
    assert seen[("kvcr_policy_tier_level_capacity_bytes", "dram")] == dram["capacity_bytes"]
    assert seen[("kvcr_policy_tier_level_capacity_bytes", "file")] == disk["capacity_bytes"]
    assert seen[("kvcr_policy_tier_level_used_bytes", "file")] == 12 * GEO.page_bytes
    assert seen[("kvcr_policy_tier_level_read_bytes_total", "file")] == 4 * GEO.page_bytes
    assert seen[("kvcr_policy_tier_level_hits_total", "dram")] == 4
    assert seen[("kvcr_policy_tier_level_read_seconds_total", "dram")] == pytest.approx(
        dram["read_s"]
    )
    pipeline.close()
    gone = _levels(profile.stem)
    assert ("kvcr_policy_tier_level_used_bytes", "file") not in gone  # went with the tier
    assert gone[("kvcr_policy_tier_level_hits_total", "file")] == 4  # counters stay
