"""The Security section of docs/peer.md states the server's limits with their numbers: each
number is the code's constant, and its ``serve --metrics`` example runs as written (with a free
port)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from kvcr_policy.backends.peer.server import admission, budget, tiers
from kvcr_policy.cli import numbers as cli_numbers
from kvcr_policy.config.private_files import MAX_PRIVATE_BYTES
from kvcr_policy.tune.setup import MAX_BUDGET_S, MIN_BUDGET_S
from tests.backends.peer.peer_helpers import need_ucxx
from tests.support.commands import run_command
from tests.support.paths import ROOT, child_env
from tests.support.processes import next_line

PAGE = (ROOT / "docs" / "peer.md").read_text(encoding="utf-8")
SECURITY = PAGE[PAGE.index("## Security") :]
EXAMPLE = "kvcr-policy serve --metrics 0.0.0.0:9480 --set observability.metrics_public=true"


def _says(text: str) -> None:
    assert " ".join(text.split()) in " ".join(SECURITY.split()), text


def test_the_security_section_states_the_codes_numbers() -> None:
    _says(f"plus {tiers.SLOT_COST >> 10} KiB of bookkeeping (`SLOT_COST`")
    _says(
        f"Payloads over {budget.FREE_PAYLOAD >> 10} KiB draw on a {budget.MAX_BUFFERED >> 20} MiB"
    )
    _says(f"{admission.MAX_HANDSHAKES} at once and {admission.MAX_HANDSHAKES_PER_ADDRESS} from")
    _says(f"{admission.MAX_SESSIONS} sessions in all")
    _says(f"(at most {MAX_PRIVATE_BYTES >> 10} KiB)")
    assert cli_numbers.MAX_TOKENS == 2**40 and cli_numbers.MAX_DIM == 2**20
    _says("(`--tokens` at most 2^40, a model dimension at most 2^20, `tune --budget` 1 s to a week")
    assert (MIN_BUDGET_S, MAX_BUDGET_S) == (1.0, 7 * 86400.0)
    _says("each of its sessions at most 16 MiB more")  # tests/backends/peer/test_peer_memory.py
    assert EXAMPLE in SECURITY


def test_a_public_metrics_address_is_refused_without_the_opt_in() -> None:
    refused = run_command(*EXAMPLE.split()[1:4], timeout=120)
    assert refused.returncode == 2
    assert "observability.metrics_public" in refused.stderr


@pytest.mark.ucx
def test_the_docs_public_metrics_example_serves() -> None:
    need_ucxx()
    argv = re.sub(r":9480\b", ":0", EXAMPLE).split()[1:]  # a free port, not 9480
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvcr_policy", *argv, "--listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=child_env(),
    )
    try:
        line = json.loads(next_line(proc))
        assert line["metrics"].startswith("http://0.0.0.0:"), line
    finally:
        proc.terminate()
        proc.wait(timeout=30)
