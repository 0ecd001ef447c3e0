"""Benchmark-only code stays off the runtime import path (checked in a fresh interpreter)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

PROBE = """
import json, sys
for name in sys.argv[1:]:
    __import__(name)
print(json.dumps({
    "bench": sorted(m for m in sys.modules if m.split(".")[:2] == ["kvcr_policy", "bench"]),
    "stub": [type(f).__name__ for f in sys.meta_path if "Torchvision" in type(f).__name__],
}))
"""


def imported_after(*modules: str) -> dict[str, list[str]]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *modules], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout.splitlines()[-1]))


@pytest.mark.parametrize(
    "module", ["kvcr_policy", "kvcr_policy.pipeline", "kvcr_policy.cli", "kvcr_policy.mover"]
)
def test_runtime_modules_never_import_the_bench(module: str) -> None:
    assert imported_after(module) == {"bench": [], "stub": []}


@pytest.mark.sglang
def test_the_sglang_backend_never_imports_the_bench_or_its_torchvision_stub() -> None:
    if importlib.util.find_spec("sglang") is None:
        pytest.skip("sglang==0.5.23 is not installed; run `bash .ci/install-sglang.sh`")
    assert imported_after("kvcr_policy.integrations.sglang.storage") == {"bench": [], "stub": []}


def test_the_probe_sees_the_bench_when_it_is_imported() -> None:
    # The checks above can fail: an import of the bench package shows up in the list.
    got = imported_after("kvcr_policy.bench")
    assert "kvcr_policy.bench.runner" in got["bench"]
