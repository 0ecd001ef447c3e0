"""Two HiCache client processes on one Mooncake Store, through SGLang's own factory.

One process stores pages of real sglang 0.5.23 host pools (every layout the backend takes:
MHA layer_first, page_first, page_first_direct, page_head; MLA layer_first, page_first,
page_first_direct) into its own segment; the other, contributing no segment, restores them
over tcp and compares them byte for byte (as SGLang reads pages, ``get_data_page``). Then the
storing process is killed -9: its segment held every page, so the same restore returns misses
(Mooncake still lists the keys for ``client_ttl`` while every get fails), never an exception.
The same store and restore then run between two network namespaces joined by a veth pair.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from tests.integrations.conftest import SGLANG_MISSING, sglang_installed
from tests.plugins.mooncake.mooncake_helpers import ClientProcess
from tests.support.installs import missing

pytestmark = [pytest.mark.mooncake, pytest.mark.sglang, pytest.mark.slow]

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


# ---- across hosts: two network namespaces joined by a veth pair ---------------------------


@pytest.fixture
def namespaces() -> Iterator[tuple[str, str, str, str]]:
    """Two network namespaces joined by a veth pair: ``(ns_a, address_a, ns_b, address_b)``.

    Skipped with the reason where they cannot be made (not root, no ``ip``, no permission in
    a container); both are deleted afterwards (which removes the veth pair with them).
    """
    if shutil.which("ip") is None:
        pytest.skip("network namespaces cannot be made here: no `ip` command (iproute2)")
    if os.geteuid() != 0:
        pytest.skip("network namespaces cannot be made here: `ip netns add` needs root")
    tag = f"{os.getpid() % 100000}{secrets.token_hex(2)}"
    ns_a, ns_b = f"kvcr-a-{tag}", f"kvcr-b-{tag}"
    net = f"10.{200 + os.getpid() % 50}.{secrets.randbelow(250)}"
    a, b = f"{net}.1", f"{net}.2"
    steps = [
        ["ip", "netns", "add", ns_a],
        ["ip", "netns", "add", ns_b],
        ["ip", "link", "add", f"kva{tag}", "type", "veth", "peer", "name", f"kvb{tag}"],
        ["ip", "link", "set", f"kva{tag}", "netns", ns_a],
        ["ip", "link", "set", f"kvb{tag}", "netns", ns_b],
        ["ip", "-n", ns_a, "addr", "add", f"{a}/24", "dev", f"kva{tag}"],
        ["ip", "-n", ns_b, "addr", "add", f"{b}/24", "dev", f"kvb{tag}"],
        ["ip", "-n", ns_a, "link", "set", f"kva{tag}", "up"],
        ["ip", "-n", ns_b, "link", "set", f"kvb{tag}", "up"],
        ["ip", "-n", ns_a, "link", "set", "lo", "up"],
        ["ip", "-n", ns_b, "link", "set", "lo", "up"],
    ]
    try:
        for step in steps:
            done = subprocess.run(step, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                pytest.skip(
                    f"network namespaces cannot be made here: `{' '.join(step)}` failed: "
                    f"{done.stderr.strip()}"
                )
        yield ns_a, a, ns_b, b
    finally:
        for ns in (ns_a, ns_b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)


def test_store_in_one_namespace_restore_in_another_over_tcp(
    namespaces: tuple[str, str, str, str], clients: Any
) -> None:
    """The cross-host path: master and storing client in one namespace, the restoring client
    in the other; pages cross the veth pair over tcp, in every layout, byte-exact."""
    ns_a, a, ns_b, b = namespaces
    storer, restorer = clients(ns_a), clients(ns_b)
    master = storer.ask("master", host=a)["address"]
    assert master.startswith(f"{a}:")
    storer.ask("open", master=master, segment_bytes="64MiB", overrides={})
    # local_hostname 'auto': the address on the route to the master, the veth's.
    opened = restorer.ask("open", master=master, segment_bytes="0", overrides={})
    assert opened["hostname"].startswith(f"{b}:"), opened
    check_round_trip(storer, restorer)
