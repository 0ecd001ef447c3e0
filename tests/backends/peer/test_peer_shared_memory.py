"""Same host, shared memory: a client maps the tier the server passes it and copies pages.

Real ``kvcr-policy serve`` processes; real Unix sockets, memfds passed with SCM_RIGHTS and
SO_PEERCRED; real pidfds for the quarantine. Raw sessions say what a library client never
would (UCX messages on a shared-memory session, a late COPIED, a reservation left open).
"""

from __future__ import annotations

import json
import mmap
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from kvcr_policy import build_pipeline, load_config
from kvcr_policy.backends.peer.wire import messages as m
from kvcr_policy.errors import UnsupportedError
from tests.backends.peer.peer_helpers import SERVER_SETS, Serve
from tests.backends.peer.raw_client import Raw, default_secret, hello
from tests.support.paths import ROOT
from tests.support.pools import fresh_keys, geometry, pages_of, pool_buffer, token_indices
from tests.support.waiting import wait_until

pytestmark = pytest.mark.ucx

CASES = [
    ("layer_first", False, None),
    ("layer_first", False, "throughput"),
    ("page_first", False, "throughput"),
    ("page_first_direct", False, None),
    ("page_head", False, "throughput"),
    ("layer_first", True, "throughput"),
    ("page_first_direct", True, None),
]


@pytest.fixture(scope="module")
def unix_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    """A server on a Unix socket only (no TCP, no UCX), with a 1 s operation timeout."""
    path = tmp_path_factory.mktemp("sock") / "tier.sock"
    server = Serve({**SERVER_SETS, "transport.op_timeout_s": 1}, listen=f"unix:{path}")
    yield server
    server.stop()


def open_pipeline(address: str, profile: str | None = None, **values: Any) -> Any:
    overrides = {
        "transport.name": "ucx",
        "transport.options.peer": address,
        "transport.options.heartbeat_s": 0.5,
        **values,
    }
    return build_pipeline(load_config(profile=profile, overrides=overrides))


def round_trip(pipeline: Any, geo: Any, n: int = 4, name: str = "kv") -> None:
    """Store pages 0..n-1, restore them into n..2n-1 of the same buffer, compare bytes."""
    buffer = pool_buffer(geo, 3)
    pipeline.register_pool(name, geo, buffer)
    keys = fresh_keys(n)
    assert pipeline.set(keys, token_indices(range(n), geo.page_size), name) == [True] * n
    assert pipeline.exists([*keys, "absent"], name) == n
    view = pages_of(buffer, geo)
    view[:, n : 2 * n] = 0
    assert pipeline.get(keys, token_indices(range(n, 2 * n), geo.page_size), name) == [True] * n
    assert np.array_equal(view[:, :n], view[:, n : 2 * n])


@pytest.mark.parametrize(("layout", "mla", "profile"), CASES)
def test_a_same_host_client_moves_to_shared_memory(
    peer: Any, layout: str, mla: bool, profile: str | None
) -> None:
    geo = geometry(layout, pages=8, mla=mla, name=f"{layout}-{mla}")
    with open_pipeline(peer.address, profile, **{"coalescing.split_bytes": 96}) as pipeline:
        round_trip(pipeline, geo, name=geo.name)
        described = pipeline.backend.describe()
        assert described["transport_used"] == "shm" and described["shared_memory"] is True
        assert described["peer"] == peer.address  # the peer as configured; pages moved locally


def test_scattered_pages_partial_runs_delete_and_clear(peer: Any) -> None:
    geo = geometry(pages=16, name="scatter")
    with open_pipeline(peer.address, "throughput") as pipeline:
        buffer = pool_buffer(geo, 1)
        pipeline.register_pool("scatter", geo, buffer)
        keys = fresh_keys(6)
        src = np.array([5, 1, 2, 3, 9, 0])
        assert pipeline.set(keys, token_indices(src, geo.page_size), "scatter") == [True] * 6
        view = pages_of(buffer, geo)
        expected = view[:, src].copy()
        dst = np.array([15, 14, 10, 11, 12, 13])
        view[:, dst] = 0
        wanted = [*keys[:3], "missing", *keys[3:]]
        indices = token_indices([*dst[:3], 4, *dst[3:6]], geo.page_size)
        got = pipeline.get(wanted, indices, "scatter")
        assert got[:3] == [True] * 3 and got[3] is False
        assert np.array_equal(view[:, dst[:3]], expected[:, :3])
        assert not view[:, dst[3:]].any()  # past the leading run nothing was written
        assert pipeline.delete(keys[:2], "scatter") == 2
        assert pipeline.exists(keys[2:], "scatter") == 4
        pipeline.clear()
        assert pipeline.exists(keys[2:], "scatter") == 0
        stats = pipeline.stats().to_dict()["pools"]["scatter"]["peer"]
        assert stats["transport_used"] == "shm"
        assert stats["remote"]["tier"]["claimed"] == 0 and stats["remote"]["tier"]["reserved"] == 0


def test_require_refuses_a_peer_that_offers_no_shared_memory() -> None:
    server = Serve({**SERVER_SETS, "transport.options.shared_memory": "off"})
    try:
        assert server.info["local"] is None
        pipeline = open_pipeline(server.address, **{"transport.options.shared_memory": "require"})
        with pytest.raises(UnsupportedError, match="offers no shared memory"):
            pipeline.register_pool("kv", geometry(pages=4), pool_buffer(geometry(pages=4)))
        pipeline.close()
        with open_pipeline(server.address) as pipeline:  # auto: UCX, as before
            round_trip(pipeline, geometry(pages=8))
            assert pipeline.backend.describe()["transport_used"] == "sm"
    finally:
        server.stop()


CLIENT_WITHOUT_UCX = """
import sys
sys.modules["ucxx"] = None  # any import of ucxx fails from here on
import numpy as np
from kvcr_policy import build_pipeline, load_config
from tests.support.pools import fresh_keys, geometry, pages_of, pool_buffer, token_indices
values = {"transport.name": "ucx", "transport.options.peer": sys.argv[1]}
with build_pipeline(load_config(overrides=values)) as pipeline:
    geo = geometry("page_first", pages=8)
    buffer = pool_buffer(geo, 5)
    pipeline.register_pool("kv", geo, buffer)
    keys = fresh_keys(4)
    assert pipeline.set(keys, token_indices(range(4), 4), "kv") == [True] * 4
    view = pages_of(buffer, geo)
    assert pipeline.get(keys, token_indices(range(4, 8), 4), "kv") == [True] * 4
    assert np.array_equal(view[:, :4], view[:, 4:8])
    print(pipeline.backend.describe()["transport_used"])
"""


def test_a_unix_peer_needs_no_ucx_on_either_side(unix_server: Serve) -> None:
    assert unix_server.address.startswith("unix:") and unix_server.info["local"]
    done = subprocess.run(
        [sys.executable, "-c", CLIENT_WITHOUT_UCX, unix_server.address],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "shm"


def attach(raw: Raw, name: str = "kv") -> m.Attached:
    geo = geometry("page_first", pages=8, name=name)
    message = m.Attach(
        name, geo.layout, geo.layers, geo.heads, geo.head_dim, geo.dtype, geo.page_size,
        geo.tokens, geo.mla, 0,
    )  # fmt: skip
    attached = raw.ask(message)
    assert isinstance(attached, m.Attached), attached
    return attached


def shared_session(address: str) -> Raw:
    raw = Raw(address)
    secret = default_secret()
    welcome = raw.handshake_with(hello(secret, tls=3), secret, b"")
    assert isinstance(welcome, m.Welcome) and welcome.tls == 3 and welcome.address == b""
    return raw


def test_a_shared_memory_session_gets_its_tier_and_moves_no_messages(unix_server: Serve) -> None:
    with shared_session(unix_server.address) as raw:
        attached = attach(raw)
        assert attached.shm_bytes > 0 and len(raw.fds) == 1
        mapping = mmap.mmap(raw.fds[0], 0, flags=mmap.MAP_SHARED)
        assert len(mapping) >= attached.shm_offset + attached.shm_bytes
        mapping.close()
        answer = raw.ask(m.Send(1, 0, np.zeros(1, np.int64), np.ones(1, np.int64)))
        assert isinstance(answer, m.Error) and "shared-memory session" in answer.text
        assert raw.reply() is None  # and the session is over
    with shared_session(unix_server.address) as raw:
        attached = attach(raw)
        # A COPIED that names no claim held: the pages it would cover are missed, not used.
        answer = raw.ask(m.Copied(12345))
        assert isinstance(answer, m.Sent) and answer.ok is False


def test_tcp_sessions_refuse_shared_memory_requests(peer: Any) -> None:
    secret = default_secret()
    with Raw(peer.address) as raw:
        answer = raw.ask(hello(secret, tls=3))
        assert isinstance(answer, m.Error) and answer.code == m.Err.UNSUPPORTED
        assert "Unix socket" in answer.text


def claimed_slots(raw: Raw) -> int:
    """Slots of the tier of ``raw``'s pool 0 claimed now, as the server's STATS says."""
    reply = raw.ask(m.Stats(0))
    assert isinstance(reply, m.StatsReply), reply
    return int(json.loads(reply.text)["tier"]["claimed"])


def test_a_claim_that_expired_while_copying_is_missed(unix_server: Serve) -> None:
    pipeline = open_pipeline(unix_server.address)
    geo = geometry("page_first", pages=8)
    buffer = pool_buffer(geo, 9)
    pipeline.register_pool("kv", geo, buffer)
    keys = fresh_keys(2)
    assert pipeline.set(keys, token_indices(range(2), geo.page_size), "kv") == [True, True]
    with shared_session(unix_server.address) as raw:
        attach(raw)
        claimed = raw.ask(m.Claim(0, keys, np.arange(2, dtype=np.int64)))
        assert isinstance(claimed, m.Claimed) and len(claimed.slots) == 2
        assert claimed_slots(raw) == 2
        # The server's op_timeout_s is 1 s: wait (on evidence, not the clock) until it let
        # the claim go; a server that kept an expired claim never gets there.
        wait_until(lambda: claimed_slots(raw) == 0, "the server releasing the expired claim", 30)
        answer = raw.ask(m.Copied(claimed.claim))
        assert isinstance(answer, m.Sent) and answer.ok is False
    pipeline.close()


HOLDER = """
import sys
import numpy as np
from tests.backends.peer.raw_client import Raw, default_secret, hello
from tests.backends.peer.test_peer_shared_memory import attach
from kvcr_policy.backends.peer.wire import messages as m
raw = Raw(sys.argv[1])
secret = default_secret()
raw.handshake_with(hello(secret, tls=3), secret, b"")
attach(raw)
keys = [f"held-{i}" for i in range(4)]
reserved = raw.ask(m.Reserve(0, keys, np.arange(4, dtype=np.int64), 0, []))
assert isinstance(reserved, m.Reserved) and (reserved.slots >= 0).all(), reserved
print("reserved", flush=True)
sys.stdin.readline()
raw.sock.close()  # the session ends; this process may still be copying, as far as it knows
print("closed", flush=True)
sys.stdin.readline()
"""


def tier_counts(address: str) -> tuple[int, int]:
    """(slots reserved in tenant default's tier 'kv', slots the server holds in quarantine)."""
    with shared_session(address) as raw:
        attach(raw)
        reply = raw.ask(m.Stats(0))
        assert isinstance(reply, m.StatsReply)
        data = json.loads(reply.text)
        return int(data["tier"]["reserved"]), int(data["server"]["quarantined_slots"])


def test_reservations_of_a_gone_session_wait_for_its_process(unix_server: Serve) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(HOLDER), unix_server.address],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdin is not None and holder.stdout is not None
    try:
        assert holder.stdout.readline().strip() == "reserved"
        assert tier_counts(unix_server.address) == (4, 0)
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert holder.stdout.readline().strip() == "closed"
        # The session is gone, its process is not: the slots stay reserved, in quarantine.
        wait_until(lambda: tier_counts(unix_server.address) == (4, 4), "quarantined", 20)
        time.sleep(0.5)
        assert tier_counts(unix_server.address) == (4, 4)
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert holder.wait(20) == 0
        wait_until(lambda: tier_counts(unix_server.address) == (0, 0), "released at exit", 20)
    finally:
        holder.kill()
        holder.wait()


def test_a_set_of_many_batches_names_its_keys_once(
    unix_server: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each RESERVE of a set's batches used to carry the set's other keys (up to 16,384): a set
    of 100,000 keys in batches of 128 queued gigabytes of keys (the bench's metadata phase
    closed its own connection). The keys now go with the first batch; the others name the
    call, whose keys the server keeps. The set stores every key, byte for byte."""
    from kvcr_policy.backends.peer.client.connection import Connection

    sent: list[m.Reserve] = []
    request = Connection.request

    def spy(self: Any, message: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(message, m.Reserve):
            sent.append(message)
        return request(self, message, *args, **kwargs)

    monkeypatch.setattr(Connection, "request", spy)
    n = 4096
    geo = geometry("page_first", pages=n, layers=1, head_dim=2, name="many")
    with open_pipeline(unix_server.address, "default") as pipeline:
        buffer = pool_buffer(geo, 5)
        pipeline.register_pool("many", geo, buffer)
        keys = fresh_keys(n)
        assert pipeline.set(keys, token_indices(range(n), geo.page_size), "many") == [True] * n
        assert pipeline.exists(keys, "many") == n
    assert len(sent) >= n // 128 and len({r.call for r in sent}) == 1 and sent[0].call > 0
    assert sum(len(r.keep) for r in sent) < n
