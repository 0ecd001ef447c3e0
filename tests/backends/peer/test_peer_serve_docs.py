"""docs/peer.md, "Running serve for operators": its commands run as written (the metrics port
and the default data port made free ones, as the docs runner does), each answering what its
comment says, and the log line it shows for a wrong secret is the server's."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from kvcr_policy.errors import AuthenticationError
from tests.backends.peer.peer_helpers import need_ucxx
from tests.backends.peer.tenants import client_factory, write_secret
from tests.support.paths import ROOT, child_env
from tests.support.pools import geometry, pool_buffer
from tests.support.processes import next_line

pytestmark = [pytest.mark.ucx]

PAGE = (ROOT / "docs" / "peer.md").read_text(encoding="utf-8")
SECTION = PAGE[PAGE.index("## Running `serve` for operators") : PAGE.index("## One host")]
MARK = "tests/backends/peer/test_peer_serve_docs.py runs these on free ports -->"


def _fenced(after: str, language: str) -> list[str]:
    start = SECTION.index(f"```{language}\n", SECTION.index(after)) + len(language) + 4
    return SECTION[start : SECTION.index("```", start)].strip().splitlines()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_the_health_commands_answer_what_the_docs_say(tmp_path: Path) -> None:
    need_ucxx()
    lines = _fenced(MARK, "bash")
    serve, curls = lines[0], lines[1:]
    assert serve.startswith("kvcr-policy serve ") and serve.endswith(" &"), serve
    port = str(_free_port())
    argv = serve.removesuffix(" &").replace("9480", port).split()[1:]
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvcr_policy", *argv, "--listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(drop=("KVCR_POLICY_",)),
    )
    try:
        line = json.loads(next_line(proc))
        assert line["metrics"] == f"http://127.0.0.1:{port}/metrics"
        for curl in curls:
            command, _, says = curl.partition("#")
            done = subprocess.run(
                ["bash", "-c", command.replace("9480", port)],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert done.stdout.strip() == says.strip(), (curl, done.stdout, done.stderr)
        address = line["listening"]
        makers = client_factory(address)
        make = next(makers)
        try:
            geo = geometry(pages=2)
            with pytest.raises(AuthenticationError):
                make(write_secret(tmp_path / "wrong")).register_pool("kv", geo, pool_buffer(geo))
        finally:
            next(makers, None)
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    shown = _fenced("A wrong secret is counted and logged", "text")[0]
    pattern = re.escape(shown).replace("51234", r"\d+")
    logged = [json.loads(x)["message"] for x in err.splitlines() if x.startswith('{"time"')]
    assert any(re.fullmatch(pattern, message) for message in logged), logged


def test_the_numbers_are_the_codes() -> None:
    from kvcr_policy.backends.peer.options import DATA_PORT
    from kvcr_policy.backends.peer.server import fd_limit
    from kvcr_policy.observability import http, repeats

    text = " ".join(SECTION.split())
    assert f"`127.0.0.1:{DATA_PORT}`" in text and f"gets port {DATA_PORT}" in text
    assert f"has {http.DEADLINE_S:.0f} s to send" in text
    assert f"at most {http.MAX_CONNECTIONS} are held" in text
    assert f"at most {http.MAX_HEAD // 1024} KiB" in text and f"is {http.BACKLOG}." in text
    assert f"once per {repeats.INTERVAL_S:.0f} s" in text
    assert f"about {fd_limit.PER_SESSION} descriptors" in text
    assert f"x {fd_limit.PER_SESSION} + {fd_limit.RESERVE}" in text
