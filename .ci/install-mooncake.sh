#!/usr/bin/env bash
# Install the Mooncake transfer engine for the `mooncake` tier backend, on a CPU-only machine.
#
# The CPU wheel (mooncake-transfer-engine-non-cuda; the CUDA build needs libcuda.so.1, GPU hosts
# only) and the Debian package libibverbs1, which `import mooncake.store` needs even for tcp
# (checked on a CPU-only machine). torch is never touched: the wheel does not depend on it.
#
# Idempotent, and fast when everything is already there: one Python probe, then exit.
# Usage: bash .ci/install-mooncake.sh        (PYTHON=python3.11 to pick another interpreter)
set -euo pipefail

PYTHON="${PYTHON:-python}"
MOONCAKE="mooncake-transfer-engine-non-cuda==0.3.13.post1"

probe() {
    "$PYTHON" - "${MOONCAKE#*==}" <<'PY'
import importlib.metadata as md
import sys

got = md.version("mooncake-transfer-engine-non-cuda")
if got != sys.argv[1]:
    sys.exit(f"mooncake-transfer-engine-non-cuda {got} != {sys.argv[1]}")
import mooncake.store  # noqa: F401  (fails without libibverbs.so.1)
PY
}

if reason=$(probe 2>&1); then
    echo "install-mooncake: $MOONCAKE and libibverbs1 already installed"
    exit 0
fi
echo "install-mooncake: installing ($(echo "$reason" | tail -n 1))"

if ! ldconfig -p | grep -q 'libibverbs\.so\.1 '; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends libibverbs1
fi
# A constraint, not a requirement: torch is never installed or changed here.
pin="$(mktemp)"
trap 'rm -f "$pin"' EXIT
echo "torch==2.13.0" >"$pin"
"$PYTHON" -m pip install --quiet --disable-pip-version-check -c "$pin" "$MOONCAKE"

probe
echo "install-mooncake: done"
