#!/usr/bin/env bash
# Install the pinned sglang==0.5.23 for the HiCache integration tests, on a CPU-only machine.
#
# Never a plain `pip install sglang`: its metadata pins torch 2.14.1 and ~60 CUDA packages.
# So torch is pinned to the CPU 2.13.0 through a constraint file, sglang and the few packages
# that would pull a CUDA build come in with --no-deps, and the rest is exactly what the
# storage path imports (checked on a CPU-only machine). `pip check` fails afterwards on
# purpose (sglang's CUDA requirements stay unmet): don't run it.
#
# Idempotent, and fast when everything is already there: one Python probe, then exit.
# Usage: bash .ci/install-sglang.sh        (PYTHON=python3.11 to pick another interpreter)
set -euo pipefail

PYTHON="${PYTHON:-python}"
SGLANG_VERSION="0.5.23"
TORCH_VERSION="2.13.0"

probe() {
    "$PYTHON" - "$SGLANG_VERSION" "$TORCH_VERSION" <<'PY'
import importlib.metadata as md
import sys

want = {"sglang": sys.argv[1], "torch": sys.argv[2]}
needed = [
    "triton", "transformers", "dill", "sentencepiece", "compressed-tensors", "loguru",
    "gguf", "apache-tvm-ffi", "orjson", "pybase64", "msgspec", "pyzmq", "IPython", "aiohttp",
    "uvicorn", "prometheus-client",
]
try:
    for name, version in want.items():
        got = md.version(name)
        if got.split("+")[0] != version:
            sys.exit(f"{name} {got} != {version}")
    for name in needed:
        md.version(name)
except md.PackageNotFoundError as err:
    sys.exit(f"missing {err}")
PY
}

if reason=$(probe 2>&1); then
    echo "install-sglang: sglang==$SGLANG_VERSION and its CPU dependencies already installed"
    exit 0
fi
echo "install-sglang: installing ($reason)"

pin="$(mktemp)"
trap 'rm -f "$pin"' EXIT
echo "torch==$TORCH_VERSION" >"$pin"

pip() { "$PYTHON" -m pip install --quiet --disable-pip-version-check "$@"; }

# An installed 2.13.0 (the CPU build the project installs first) satisfies this and is kept.
pip -c "$pin" "torch==$TORCH_VERSION"
pip --no-deps "sglang==$SGLANG_VERSION"
# From here on pip reports "sglang 0.5.23 requires ..., which is not installed": expected.
# Enough for hicache_storage (HiCacheStorage, HiCacheFile, PoolTransfer, ...) and the
# storage backend factory.
pip -c "$pin" numpy orjson psutil pybase64 requests packaging pillow starlette msgspec \
    pydantic pyzmq tqdm IPython aiohttp
# SGLang's /metrics (add_prometheus_middleware: a MultiProcessCollector served by uvicorn),
# which the metrics test reads the backend's metrics through.
pip -c "$pin" uvicorn prometheus-client
# Stubbing triton breaks torch inside pool_host, so it is installed for real (about 1 GB);
# 3.9.0 is the release checked with torch 2.13.0.
pip --no-deps "triton==3.9.0"
# pool_host (HostKVCache) and pool_host.mha (MHATokenToKVPoolHost).
pip -c "$pin" "transformers==5.19.0" dill "sentencepiece==0.2.1" "compressed-tensors==0.18.0" \
    loguru gguf
pip --no-deps "apache-tvm-ffi==0.1.11"

probe
echo "install-sglang: done"
