"""Authentication and tenants over real ucxx on loopback: nobody reads or writes pages that
are not theirs (the red-team cases of 2026-12-01, S1 and S7)."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvcr_policy.backends.peer import auth
from kvcr_policy.backends.peer.server.tiers import SLOT_COST
from kvcr_policy.backends.peer.wire import messages as m
from kvcr_policy.errors import AuthenticationError, CapacityError, ConfigError
from tests.backends.peer.peer_helpers import need_ucxx
from tests.backends.peer.raw_client import Raw, hello
from tests.backends.peer.tenants import (
    client_factory,
    listening_addresses,
    start_peer,
    tenants_dir,
    write_secret,
)
from tests.support.pools import fresh_keys, geometry, pages_of, pool_buffer, token_indices

pytestmark = [pytest.mark.ucx]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tenants_dir(tmp_path_factory.mktemp("security"))


@pytest.fixture(scope="module")
def server(folder: Path) -> Iterator[Any]:
    peer = start_peer(folder)
    yield peer
    peer.stop()


@pytest.fixture
def client(server: Any) -> Iterator[Callable[..., Any]]:
    yield from client_factory(server.address)


def _stored(make: Callable[..., Any], secret: Path, n: int = 8, seed: int = 1) -> Any:
    """A pipeline of the tenant of ``secret`` with ``n`` pages stored under fresh keys."""
    geo = geometry(pages=2 * n)
    buffer = pool_buffer(geo, seed)
    pipeline = make(secret)
    pipeline.register_pool("kv", geo, buffer)
    keys = fresh_keys(n)
    assert pipeline.set(keys, token_indices(range(n), geo.page_size)) == [True] * n
    return pipeline, geo, buffer, keys


def test_another_tenant_reads_dumps_poisons_and_clears_nothing_of_the_victim(
    client: Any, folder: Path
) -> None:
    victim, geo, stored, keys = _stored(client, folder / "alice")
    n = len(keys)
    original = pages_of(stored, geo)[:, :n].copy()

    attacker = client(folder / "bob")
    loot = np.zeros(geo.shape, dtype=np.float16)
    attacker.register_pool("kv", geo, loot)  # the victim's pool name and geometry
    # (a) read by key
    assert attacker.exists(keys) == 0
    assert attacker.get(keys, token_indices(range(n), geo.page_size)) == [False] * n
    # (b) dump: the whole tier this session can reach, and the stats it may see
    attacker.probe(geo.nbytes)
    dumped = pages_of(loot, geo)
    for page in range(geo.pages):
        for mine in range(n):
            assert not np.array_equal(dumped[:, page], original[:, mine]), "a victim page leaked"
    remote = attacker.stats().to_dict()["pools"]["kv"]["peer"]["remote"]
    assert remote["tier"]["keys"] == 0
    assert remote["server"]["tenant"] == "bob" and "tenants" not in remote["server"]
    # (c) delete, then write the victim's keys with other bytes
    assert attacker.delete(keys) == 0
    poison = pool_buffer(geo, 99)
    attacker.close()
    poisoner = client(folder / "bob")
    poisoner.register_pool("kv", geo, poison)
    assert poisoner.set(keys, token_indices(range(n), geo.page_size)) == [True] * n
    # (d) clear every page it can reach
    poisoner.clear()

    assert victim.exists(keys) == n
    restored = pool_buffer(geo, 7)
    reader = client(folder / "alice")
    reader.register_pool("kv", geo, restored)
    assert reader.get(keys, token_indices(range(n, 2 * n), geo.page_size)) == [True] * n
    assert np.array_equal(pages_of(restored, geo)[:, n : 2 * n], original)
    assert poisoner.exists(keys) == 0  # bob's own copy went with his clear


def test_no_secret_or_a_wrong_one_reaches_nothing(
    client: Any, folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    geo = geometry(pages=4)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))  # no default secret file either
    without = client(None)
    with pytest.raises(AuthenticationError, match="KVCR_POLICY_SECURITY__SECRET"):
        without.register_pool("kv", geo, pool_buffer(geo))
    stranger = client(write_secret(tmp_path / "stranger"))
    with pytest.raises(AuthenticationError, match="could not prove"):
        stranger.register_pool("kv", geo, pool_buffer(geo))


def test_before_authentication_only_the_handshake_is_heard(
    server: Any, folder: Path, worker: Any, client: Any
) -> None:
    victim, _, _, keys = _stored(client, folder / "alice", n=2)
    secret = (folder / "alice").read_text().strip().encode()
    requests = [
        m.Attach("kv", "layer_first", 3, 2, 16, "float16", 4, 32, False, 0),
        m.Exists(0, keys),
        m.Clear(0),
        m.Probe(0, 1, 64),
        m.Auth(b"", worker.address),
    ]
    for request in requests:  # first message: anything but HELLO closes the connection
        with Raw(server.address) as raw:
            reply = raw.ask(request)
            assert isinstance(reply, m.Error) and reply.code == m.Err.PROTOCOL
            assert raw.reply() is None
    with Raw(server.address) as raw:  # a request after CHALLENGE instead of AUTH
        assert isinstance(raw.ask(hello(secret)), m.Challenge)
        reply = raw.ask(m.Clear(0))
        assert isinstance(reply, m.Error) and reply.code == m.Err.PROTOCOL
    with Raw(server.address) as raw:  # alice's key id, a proof made without her secret
        assert isinstance(raw.ask(hello(secret)), m.Challenge)
        reply = raw.ask(m.Auth(b"\0" * auth.PROOF_BYTES, worker.address))
        assert isinstance(reply, m.Error) and reply.code == m.Err.AUTH
        assert raw.reply() is None
    with Raw(server.address) as raw:  # a proof recorded from another handshake (replay)
        opening = hello(secret)
        challenge = raw.ask(opening)
        assert isinstance(challenge, m.Challenge)
        stale = auth.proof(secret, "client", opening.key_id, opening.nonce, b"\1" * 32,
                           worker.address)  # fmt: skip
        reply = raw.ask(m.Auth(stale, worker.address))
        assert isinstance(reply, m.Error) and reply.code == m.Err.AUTH
    with Raw(server.address) as raw:  # this handshake's proof, sent with another UCX address
        opening = hello(secret)
        challenge = raw.ask(opening)
        assert isinstance(challenge, m.Challenge)
        other = worker.address[:-1] + bytes([worker.address[-1] ^ 1])
        bound = auth.proof(secret, "client", opening.key_id, opening.nonce, challenge.nonce,
                           other)  # fmt: skip
        reply = raw.ask(m.Auth(bound, worker.address))  # the worker's pages would go elsewhere
        assert isinstance(reply, m.Error) and reply.code == m.Err.AUTH
        assert raw.reply() is None
    with Raw(server.address) as raw:  # the server's own proof sent back (reflection)
        opening = hello(secret)
        challenge = raw.ask(opening)
        assert isinstance(challenge, m.Challenge)
        reply = raw.ask(m.Auth(challenge.proof, worker.address))
        assert isinstance(reply, m.Error) and reply.code == m.Err.AUTH
    with Raw(server.address) as raw:  # the real thing still works
        assert isinstance(raw.handshake(secret, worker.address), m.Welcome)
        assert raw.welcome is not None and raw.welcome.tenant == "alice"
    assert victim.exists(keys) == 2


def test_the_ucx_worker_listens_only_where_the_control_socket_does(
    server: Any, client: Any, folder: Path
) -> None:
    # A tcp session: its UCX worker on the server listens on tcp (a same-host session's
    # worker offers shared memory only, and listens nowhere).
    pipeline, *_ = _stored(
        lambda secret: client(secret, transport__options__tls="tcp"), folder / "alice", n=2
    )
    assert pipeline.backend.describe()["transport_used"] == "tcp"
    addresses = listening_addresses(server.proc.pid)
    assert len(addresses) >= 2, addresses  # the control socket and UCX's tcp listener
    assert set(addresses) == {"127.0.0.1"}, addresses


def test_an_insecure_peer_is_loopback_only_and_clients_must_opt_in(tmp_path: Path) -> None:
    need_ucxx()
    from kvcr_policy import load_config
    from kvcr_policy.backends.peer.server.server import PeerServer
    from kvcr_policy.errors import ArgumentError

    wide = subprocess.run(
        [sys.executable, "-m", "kvcr_policy", "serve", "--insecure", "--listen", "0.0.0.0:0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert wide.returncode == 2, wide.stderr
    assert "refuses any address but loopback" in wide.stderr and "Traceback" not in wide.stderr

    loaded = load_config(overrides={"security.insecure": True})
    with pytest.raises(ArgumentError, match="loopback"):
        PeerServer(loaded, listen="0.0.0.0:0")
    with PeerServer(loaded, listen="127.0.0.1:0") as peer:
        geo = geometry(pages=4)
        for make in client_factory(peer.address):
            careful = make(write_secret(tmp_path / "mine"))
            with pytest.raises(AuthenticationError, match="without authentication"):
                careful.register_pool("kv", geo, pool_buffer(geo))
            trusting = make(None, **{"security.insecure": True})
            trusting.register_pool("kv", geo, pool_buffer(geo))
            assert trusting.set(fresh_keys(2), token_indices(range(2), geo.page_size)) == [
                True,
                True,
            ]


def test_serve_makes_a_private_secret_when_none_is_configured(tmp_path: Path) -> None:
    need_ucxx()
    from kvcr_policy.backends.peer.process import PeerProcess

    home = tmp_path / "config"
    env = {"XDG_CONFIG_HOME": str(home)}
    sets = {"transport.name": "ucx", "placement.capacity_bytes": "8MiB"}
    first = PeerProcess(sets, env=env)
    try:
        created = Path(first.info["secret_created"])
        assert created == home / "kvcr-policy" / "peer.secret"
        assert created.stat().st_mode & 0o777 == 0o600
        assert created.parent.stat().st_mode & 0o777 == 0o700
        secret = created.read_text()
    finally:
        assert first.stop() == 0
    assert any(str(created) in line for line in first.log)  # said where, on stderr
    again = PeerProcess(sets, env=env)  # a second start uses the same secret
    try:
        assert again.info["secret_created"] is None
        assert again.info["secret"] == f"file {created}"
        assert created.read_text() == secret
    finally:
        again.stop()


def test_secret_files_open_to_others_are_refused(tmp_path: Path, folder: Path) -> None:
    from kvcr_policy import build_pipeline, load_config
    from kvcr_policy.backends.peer.server.server import PeerServer

    shared = write_secret(tmp_path / "shared", mode=0o644)
    loaded = load_config(
        overrides={"transport.name": "ucx", "transport.options.peer": "127.0.0.1:9"}
        | {"security.secret_file": str(shared)}
    )
    with pytest.raises(ConfigError, match="chmod 600"):
        build_pipeline(loaded)
    open_dir = tmp_path / "open"
    open_dir.mkdir(mode=0o777)
    open_dir.chmod(0o777)
    write_secret(open_dir / "alice")
    with pytest.raises(ConfigError, match="chmod 700"):
        PeerServer(load_config(overrides={"security.tenants_dir": str(open_dir)}))
    assert os.stat(folder).st_mode & 0o077 == 0


def test_a_tenant_quota_caps_what_it_maps(folder: Path) -> None:
    peer = start_peer(folder, **{"security.tenant_quota_bytes": "40KiB"})
    try:
        assert peer.info["insecure"] is False
        for make in client_factory(peer.address):
            geo = geometry(pages=64)  # 1,536-byte pages and 3 KiB of bookkeeping: 8 in 40 KiB
            pipeline = make(folder / "alice")
            pipeline.register_pool("kv", geo, pool_buffer(geo))
            tier = pipeline.stats().to_dict()["pools"]["kv"]["peer"]["remote"]["tier"]
            assert tier["capacity"] == (40 << 10) // (geo.page_bytes + SLOT_COST) == 8
            other = geometry(pages=64, layout="page_first", name="kv2")
            with pytest.raises(CapacityError, match="tenant_quota_bytes"):
                pipeline.register_pool("kv2", other, pool_buffer(other))
            bob = make(folder / "bob")  # another tenant's quota is its own
            bob.register_pool("kv2", other, pool_buffer(other))
    finally:
        peer.stop()


def test_a_silent_listener_fails_the_handshake_naming_connect_timeout_s(
    tmp_path: Path,
) -> None:
    """Red team S5: a listener that accepts and never answers HELLO; the client gives up after
    ``transport.options.connect_timeout_s`` and names that knob, not ``op_timeout_s``."""
    import socket
    import threading

    need_ucxx()
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    heard = threading.Event()

    def accept() -> None:
        conn, _ = listener.accept()
        accepted.append(conn)
        if conn.recv(1 << 16):  # the HELLO arrived, and is never answered
            heard.set()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    address = f"127.0.0.1:{listener.getsockname()[1]}"
    geo = geometry(pages=2)
    try:
        for make in client_factory(address):
            pipeline = make(
                write_secret(tmp_path / "s"),
                transport__options__connect_timeout_s=0.5,
                transport__op_timeout_s=30,
            )
            with pytest.raises(Exception, match=r"transport\.options\.connect_timeout_s"):
                pipeline.register_pool("kv", geo, pool_buffer(geo))
        assert heard.is_set(), "the client never sent its HELLO"
    finally:
        for conn in accepted:
            conn.close()
        listener.close()


def test_transfer_tags_are_drawn_at_random(worker: Any) -> None:
    """Red team S7: a tag receive matches on the worker, so a tag anyone can guess lets any
    connected process write into it; tags are drawn, not counted."""
    firsts = [worker.tags(16) for _ in range(64)]
    assert len(set(firsts)) == 64
    steps = {b - a for a, b in itertools.pairwise(firsts)}
    assert len(steps) > 32  # no counter, no fixed stride
    assert max(firsts) > 1 << 48  # spread over the 64-bit space
