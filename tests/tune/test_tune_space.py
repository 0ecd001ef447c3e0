"""The search space: built from the declarations of the fields a starting config uses,
built-in and third-party alike."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest

from kvcr_policy import load_config
from kvcr_policy.tune.setup import TuneError
from kvcr_policy.tune.space import search_space

pytestmark = pytest.mark.usefixtures("clean_env")


def paths(profile: str | Path, **kwargs: object) -> set[str]:
    overrides = kwargs.pop("overrides", None)
    loaded = load_config(profile=profile, overrides=overrides, dotenv=False)  # type: ignore[arg-type]
    return {k.path for k in search_space(loaded, **kwargs)}  # type: ignore[arg-type]


def test_the_cpu_space_of_throughput() -> None:
    found = paths("throughput")
    assert {
        "batching.read_batch_pages",
        "batching.window_batches",
        "coalescing.split_bytes",
        "transport.stream_min_bytes",
        "transport.options.min_parallel_bytes",
    } <= found
    assert not any("gather" in p for p in found)


def test_the_cuda_space_takes_the_cuda_transport_options_and_drops_the_cpu_knobs() -> None:
    # Loading names the cuda transport's options model; no GPU is needed to build the space.
    found = paths("throughput", overrides={"transport.name": "cuda"})
    assert {"transport.options.gather", "transport.options.gather_chunk_bytes"} <= found
    assert "transport.threads" not in found and "transport.stream_min_bytes" not in found
    assert "transport.options.min_parallel_bytes" not in found


def test_set_values_are_fixed_and_only_narrows() -> None:
    assert "batching.read_batch_pages" not in paths(
        "throughput", fixed={"batching.read_batch_pages"}
    )
    assert paths("throughput", only={"coalescing.split_bytes"}) == {"coalescing.split_bytes"}
    with pytest.raises(TuneError, match=r"--only names no tunable knob.*batching\.nope"):
        paths("throughput", only={"batching.nope"})


def test_choices_hold_the_start_never_unset_a_set_value_and_respect_the_cpus() -> None:
    loaded = load_config(profile="throughput", dotenv=False)
    knobs = {k.path: k for k in search_space(loaded)}
    window = knobs["batching.window_batches"]
    assert None not in window.choices() and 4 in window.choices()  # TOML has no null
    split = knobs["coalescing.split_bytes"]
    assert split.same("64MiB") and not split.same("16MiB")
    threads = loaded.config.transport.threads
    cpus = os.cpu_count() or 1
    assert max(c for c in knobs["transport.threads"].choices() if c != threads) <= cpus
    trial = optuna.trial.FixedTrial({"batching.read_batch_pages": 512})
    assert knobs["batching.read_batch_pages"].suggest(trial) == 512


def test_a_third_party_option_is_a_knob_like_a_built_in(
    example_plugin: None, write_profile: Callable[..., Path]
) -> None:
    profile = write_profile(
        """
        [profile]
        base = "throughput"
        [batching]
        strategy = "adaptive"
        [batching.options]
        page_bytes = "512KiB"
        """
    )
    loaded = load_config(profile=profile, dotenv=False)
    knobs = {k.path: k for k in search_space(loaded)}
    knob = knobs["batching.options.target_batch_bytes"]
    assert knob.owner.startswith("kvcr-policy-example") and "adaptive" in knob.owner
    assert knob.start == 256 << 20 and "4MiB" in knob.choices()
