"""Two HiCache client processes on one Mooncake Store, through SGLang's own factory.

One process stores pages of real sglang 0.5.23 host pools (every layout the backend takes:
MHA layer_first, page_first, page_first_direct, page_head; MLA layer_first, page_first,
page_first_direct) into its own segment; the other, contributing no segment, restores them
over tcp and compares them byte for byte (as SGLang reads pages, ``get_data_page``). Then the
storing process is killed -9: its segment held every page, so the same restore returns misses
(Mooncake still lists the keys for ``client_ttl`` while every get fails), never an exception.
"""

from __future__ import annotations

from typing import Any

import pytest
from mooncake_helpers import ClientProcess

from tests.integrations.conftest import SGLANG_MISSING, sglang_installed
from tests.installs import missing

pytestmark = [pytest.mark.sglang, pytest.mark.slow]

PAGES = 16


@pytest.fixture
def clients() -> Any:
    if not sglang_installed():
        missing(SGLANG_MISSING)
    started: list[ClientProcess] = []

    def start(netns: str | None = None) -> ClientProcess:
        client = ClientProcess(netns)
        started.append(client)
        return client

    yield start
    for client in started:
        client.close()


def check_round_trip(storer: ClientProcess, restorer: ClientProcess) -> dict[str, Any]:
    stored = storer.ask("store", pages=PAGES)["stored"]
    assert stored and all(v == [True] * PAGES for v in stored.values()), stored
    restored = restorer.ask("restore", pages=PAGES)["restored"]
    assert set(restored) == set(stored)
    for name, result in restored.items():
        assert result["exists"] == PAGES, (name, result)
        assert result["got"] == [True] * PAGES, (name, result)
        assert result["exact"], f"{name}: restored bytes differ from the stored ones"
    return restored


def test_two_processes_byte_exact_in_every_layout_then_the_holder_is_killed(
    master: Any, clients: Any
) -> None:
    storer, restorer = clients(), clients()
    opened = storer.ask("open", master=master.address, segment_bytes="64MiB", overrides={})
    assert opened["refused"] == {}
    # No segment of its own: every page it restores crosses the process boundary over tcp.
    restorer.ask("open", master=master.address, segment_bytes="0", overrides={})
    check_round_trip(storer, restorer)

    storer.kill()
    after = restorer.ask("restore", pages=PAGES)["restored"]
    for name, result in after.items():
        assert result["got"] == [False] * PAGES, (name, result)
