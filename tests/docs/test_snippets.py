"""Every shell and Python snippet of the documentation runs as written on this machine, or is
marked with the reason it cannot and still parses (tests/docs/snippets.py says what the runner
changes). One test per page, its snippets in order, so a page may build on what it ran before."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from tests.docs.snippets import (
    LANGUAGES,
    REASONS,
    Snippet,
    command,
    documents,
    parse_problem,
    rewrite,
    scratch_folder,
    snippets,
)
from tests.support.paths import ROOT, child_env
from tests.support.processes import next_line

PLUGINS = [ROOT / "plugins" / name for name in ("kvcr-policy-example", "kvcr-policy-kvcr",
                                                  "kvcr-policy-mooncake")]  # fmt: skip
SNIPPET_TIMEOUT_S = 240.0


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _env(scratch: Path) -> dict[str, str]:
    env = child_env(drop=("KVCR_POLICY_", "XDG_CONFIG_HOME"), HOME=str(scratch / "home"))
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], *map(str, PLUGINS)])
    return env


def _failure(snippet: Snippet, code: str, done: subprocess.CompletedProcess[str]) -> str:
    return (
        f"{snippet.where}: the documented {snippet.language} snippet exits {done.returncode}\n"
        f"--- snippet (as run) ---\n{code}--- stdout (end) ---\n{done.stdout[-3000:]}\n"
        f"--- stderr (end) ---\n{done.stderr[-3000:]}"
    )


def _stop(server: subprocess.Popen[str]) -> None:
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGTERM)  # the session this test started for it
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


@pytest.mark.parametrize("page", documents(), ids=lambda path: str(path.relative_to(ROOT)))
def test_every_snippet_of_the_page_runs_or_says_why_not(page: Path, tmp_path: Path) -> None:
    found = snippets(page)
    for snippet in found:
        assert snippet.language in LANGUAGES, f"{snippet.where}: name the fence's language"
        assert snippet.skip is None or snippet.skip in REASONS, (snippet.where, snippet.skip)
        problem = parse_problem(snippet)
        assert problem is None, f"{snippet.where}: does not parse: {problem}"
    runnable = [s for s in found if s.skip is None and s.language in ("bash", "python")]
    if not runnable:
        return
    scratch_folder(tmp_path)
    env, port, servers = _env(tmp_path), _free_port(), []
    try:
        for snippet in runnable:
            code = rewrite(snippet.code, tmp_path, port)
            argv = command(snippet, code, tmp_path)
            if snippet.serve:
                server = subprocess.Popen(
                    argv, cwd=tmp_path, env=env, text=True, stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE, start_new_session=True,
                )  # fmt: skip
                servers.append(server)
                started = next_line(server, timeout=SNIPPET_TIMEOUT_S)
                assert started.startswith("{"), f"{snippet.where}: the server said {started!r}"
                continue
            done = subprocess.run(
                argv, cwd=tmp_path, env=env, text=True, capture_output=True,
                timeout=SNIPPET_TIMEOUT_S,
            )  # fmt: skip
            assert done.returncode == 0, _failure(snippet, code, done)
    finally:
        for server in servers:
            _stop(server)


def test_a_snippet_left_to_another_test_names_it_and_that_test_exists() -> None:
    for page in documents():
        for snippet in snippets(page):
            if snippet.skip == "tested":
                named = re.search(r"\btests/[\w/]+\.py\b", snippet.note)
                assert named, f"{snippet.where}: a 'tested' snippet names no test file"
                missing = f"{snippet.where}: {named.group()} does not exist"
                assert (ROOT / named.group()).is_file(), missing
