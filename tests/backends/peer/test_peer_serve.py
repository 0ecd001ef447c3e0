"""``kvcr-policy serve`` as docs/peer.md describes it: loopback by default, a clean SIGTERM.

The server runs as a child process started through its command line (``tests/backends/peer``'s
:class:`Serve`); what it does is read from outside: the JSON line it prints, the kernel's socket
table, its exit code, its log, and what clients see.
"""

from __future__ import annotations

import json
import signal
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvcr_policy import build_pipeline, load_config
from tests.backends.peer.peer_helpers import (
    Serve,
    big_geometry,
    need_ucxx,
    promised_s,
    server_config,
)
from tests.support.pools import fresh_keys, pages_of, pool_buffer, token_indices
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.ucx]

SETS = {"transport.name": "ucx", "transport.options.heartbeat_s": 0.5}


def listening_on(port: int) -> set[str]:
    """The local addresses of TCP sockets listening on ``port``, from the kernel's tables."""
    found = set()
    for table in ("tcp", "tcp6"):
        path = Path("/proc/net") / table
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            local, _, state = line.split()[1:4]
            hex_address, hex_port = local.split(":")
            if state != "0A" or int(hex_port, 16) != port:  # 0A: TCP_LISTEN (tcp_states.h)
                continue
            raw = bytes.fromhex(hex_address)
            # The address is printed as 32-bit words in host order (little-endian here).
            address = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
            found.add(".".join(map(str, address)) if len(address) == 4 else address.hex())
    return found


def test_serve_binds_loopback_unless_told_otherwise() -> None:
    need_ucxx()
    server = Serve(SETS, listen=None)  # no --listen: transport.options.listen's default
    try:
        host, port = server.address.rsplit(":", 1)
        assert (host, port) == ("127.0.0.1", "7480")  # the documented default port
        assert listening_on(int(port)) == {"127.0.0.1"}
    finally:
        assert server.stop() == 0
    assert "not loopback" not in "\n".join(server.log)

    anywhere = Serve(SETS, listen="0.0.0.0:0")
    try:
        assert listening_on(anywhere.port) == {"0.0.0.0"}
    finally:
        assert anywhere.stop() == 0
    assert any("not loopback" in line for line in anywhere.log), anywhere.log


# The server's own entry point, with one observer added: every store (one per tier) reports its
# claims and reservations at the moment it is closed, which is after every session ended.
REPORTING_SERVE = textwrap.dedent(
    """
    import json, sys
    from kvcr_policy.backends.dram import store
    from kvcr_policy.cli import main

    closing = store.Store.close

    def close(self):
        if not self.closed:
            s = self.stats()
            report = {"claimed": s.claimed, "reserved": s.reserved, "keys": s.keys}
            print("store closed " + json.dumps(report), file=sys.stderr, flush=True)
        closing(self)

    store.Store.close = close
    main(sys.argv[1:])
    """
)

OP_TIMEOUT_S = 20.0


def store_reports(server: Serve) -> list[dict[str, int]]:
    """What ``REPORTING_SERVE`` printed for each store it closed."""
    return [json.loads(line.split(" ", 2)[2]) for line in server.log if "store closed " in line]


def test_sigterm_lets_the_read_in_flight_finish_and_releases_every_claim() -> None:
    need_ucxx()
    geo = big_geometry("term")
    sets = {**SETS, "transport.op_timeout_s": OP_TIMEOUT_S, "placement.capacity_bytes": "300MiB"}
    server = Serve(sets, python=("-c", REPORTING_SERVE))
    client = {
        "transport.name": "ucx",
        "transport.options.peer": server.address,
        "transport.options.heartbeat_s": 0.5,
        "transport.options.tls": "tcp",  # slower than shared memory: a longer read to catch
        "transport.op_timeout_s": OP_TIMEOUT_S,
        "batching.read_batch_pages": 256,  # the whole read is one claim
    }
    buffer = pool_buffer(geo, 11)
    view = pages_of(buffer, geo)
    reader = build_pipeline(load_config("default", overrides=client))
    observer = build_pipeline(load_config("default", overrides=client))
    outcome: list[Any] = []
    bound = promised_s(server_config(sets))  # the server's op_timeout_s, and a heartbeat
    try:
        reader.register_pool("term", geo, buffer)
        observer.register_pool("term", geo, pool_buffer(geo, 12))
        keys = fresh_keys(128)
        assert all(reader.set(keys, token_indices(range(128), geo.page_size)))
        view[:, 128:] = 0

        def read() -> None:
            try:
                outcome.append(reader.get(keys, token_indices(range(128, 256), geo.page_size)))
            except BaseException as err:  # reported below
                outcome.append(err)

        # Evidence that the read is in flight: the server holds its claim. On a quiet host a
        # read can end between that answer and the signal; then it is read again (at most 5).
        for _ in range(5):
            view[:, 128:] = 0
            outcome.clear()
            thread = threading.Thread(target=read)
            thread.start()
            wait_until(
                lambda: tier(observer)["claimed"] > 0 or not thread.is_alive(),  # noqa: B023
                "the server holding the read's claim",
                bound,
                every=0,
            )
            if thread.is_alive():
                break
            thread.join()
        server.proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        in_flight = thread.is_alive()
        # docs/peer.md: in-flight requests finish or fail within op_timeout_s, then it stops.
        thread.join(bound)
        assert not thread.is_alive(), f"the read in flight outlived SIGTERM by {bound} s"
        code = server.stop(timeout=bound - (time.monotonic() - signalled))
    finally:
        reader.close()
        observer.close()
        server.stop()
    assert in_flight, "the read finished before SIGTERM: nothing was proven"
    assert code == 0, "\n".join(server.log[-20:])
    # The read in flight at SIGTERM finished, and every restored byte is the stored one.
    assert outcome == [[True] * 128]
    assert np.array_equal(view[:, 128:], view[:, :128])
    # Every tier's store was closed with no claim and no reservation left.
    reports = store_reports(server)
    assert reports, "\n".join(server.log[-20:])
    assert all(r["claimed"] == 0 and r["reserved"] == 0 for r in reports), reports
    log = "\n".join(server.log)
    assert "got SIGTERM" in log and "stopped" in log and "stay mapped" not in log


def tier(pipeline: Any) -> dict[str, int]:
    return pipeline.stats().pools["term"]["peer"]["remote"]["tier"]


def test_sigterm_releases_a_claim_whose_send_never_came(worker: Any) -> None:
    """A session holds a claim and never asks for its pages (CLAIMED, then nothing): SIGTERM's
    grace runs out, the session is cut, and its claim is released before the store closes."""
    from kvcr_policy.backends.peer.wire import messages as m
    from tests.backends.peer.raw_client import Raw, default_secret
    from tests.support.pools import geometry

    geo = geometry(pages=8, name="hold")
    sets = {**SETS, "transport.op_timeout_s": OP_TIMEOUT_S}
    server = Serve(sets, python=("-c", REPORTING_SERVE), args=("--grace", "0.5"))
    client = {"transport.name": "ucx", "transport.options.peer": server.address}
    writer = build_pipeline(load_config("default", overrides=client))
    raw = Raw(server.address)
    try:
        writer.register_pool("hold", geo, pool_buffer(geo, 3))
        keys = fresh_keys(4)
        assert writer.set(keys, token_indices(range(4), geo.page_size)) == [True] * 4
        assert isinstance(raw.handshake(default_secret(), worker.address), m.Welcome)
        attach = m.Attach(
            "hold", geo.layout, geo.layers, geo.heads, geo.head_dim, geo.dtype,
            geo.page_size, geo.tokens, geo.mla, 0,
        )  # fmt: skip
        attached = raw.ask(attach)
        assert isinstance(attached, m.Attached), attached
        claimed = raw.ask(m.Claim(attached.pool, keys, np.arange(4, dtype=np.int64)))
        assert isinstance(claimed, m.Claimed) and len(claimed.slots) == 4, claimed
        held = writer.stats().pools["hold"]["peer"]["remote"]["tier"]["claimed"]
        assert held == 4  # evidence: the server holds the raw session's claim
        server.proc.send_signal(signal.SIGTERM)
        code = server.stop(timeout=promised_s(server_config(sets)))
    finally:
        raw.close()
        writer.close()
        server.stop()
    assert code == 0, "\n".join(server.log[-20:])
    reports = store_reports(server)
    assert reports and all(r["claimed"] == 0 for r in reports), (reports, server.log[-20:])
    assert any("released 1 claims" in line or "released 4 claims" in line for line in server.log)
