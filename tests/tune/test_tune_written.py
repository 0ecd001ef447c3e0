"""The written profile: it re-loads with the tuned values from the file, everything else from
its base, and holds only the values that differ from that base."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kvcr_policy import load_config
from kvcr_policy.config.profiles import read_meta
from kvcr_policy.config.selection import bundled_profiles
from kvcr_policy.config.sources import flatten
from kvcr_policy.tune.written import render_profile, spell

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

pytestmark = pytest.mark.usefixtures("clean_env")

TUNED = {
    "batching.read_batch_pages": 512,
    "coalescing.split_bytes": "16MiB",
    "thread_tuning.switch_interval_s": 0.001,
    "transport.options.min_parallel_bytes": 1 << 20,
}


def test_the_written_profile_reloads_with_provenance_and_only_differing_values(
    tmp_path: Path,
) -> None:
    path = tmp_path / "site.toml"
    header = ["tuned", "host: a CPU; 2 cores", 'command: kvcr-policy tune --write "site.toml"']
    record = {"target": "cpu", "backend": None, "tokens": 256, "set": {"a.b": "1"}}
    path.write_text(render_profile(base="throughput", values=TUNED, header=header, record=record))
    text = path.read_text()
    assert text.startswith("# tuned\n# host: a CPU; 2 cores\n")

    loaded = load_config(profile=path, dotenv=False)
    base = load_config(profile="throughput", dotenv=False)
    mine, theirs = (flatten(x.config.model_dump(mode="json")) for x in (loaded, base))
    differing = {p for p in mine if mine[p] != theirs[p]}
    assert differing == set(TUNED)  # exactly the tuned values, nothing else
    for p in TUNED:
        assert loaded.origin(p).startswith(f"profile {path} [")
    throughput = str(bundled_profiles()["throughput"])
    assert loaded.origin("batching.window_batches") == f"profile {throughput} [batching]"
    assert loaded.config.coalescing.split_bytes == 16 << 20

    data = tomllib.loads(text)  # only the tuned values sit in the config tables
    written = flatten({k: v for k, v in data.items() if k != "profile"})
    assert set(written) == set(TUNED)
    meta, issues = read_meta(path)
    assert issues == [] and meta.base == "throughput"
    assert dict(meta.tune) == {"target": "cpu", "tokens": 256, "set": {"a.b": "1"}}


def test_values_are_spelled_as_toml() -> None:
    assert [spell(v) for v in (True, 3, 0.0005, 'a"b', [1, 2])] == [
        "true",
        "3",
        "0.0005",
        '"a\\"b"',
        "[1, 2]",
    ]
    assert tomllib.loads(f"x = {spell({'transport.name': 'cuda'})}")["x"] == {
        "transport.name": "cuda"
    }
    with pytest.raises(ValueError, match="TOML cannot hold"):
        spell(None)
