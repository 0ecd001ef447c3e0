"""A connection the server closes before it answered HELLO is tried again within the connect
limit (a server whose handshake slots are full drops those that sent nothing yet, and a client
starved between its connect and its HELLO is one of them); any other failure is not."""

from __future__ import annotations

from typing import Any

import pytest

from kvcr_policy.errors import BackendUnavailableError
from tests.backends.peer.proxy import Proxy
from tests.backends.peer.test_peer_roundtrip import round_trip
from tests.support.pools import geometry, pool_buffer

pytestmark = [pytest.mark.ucx]


def test_a_handshake_dropped_before_hello_is_tried_again(peer: Any, connect: Any) -> None:
    proxy = Proxy(peer.address, drop=3)
    try:
        # A generous limit: the three retries wait 50 + 100 + 200 ms.
        pipeline = connect(address=proxy.address, transport__options__connect_timeout_s=60)
        round_trip(pipeline, geometry(pages=8, name="retried"), n=2, name="retried")
        assert proxy.accepted == 4
        assert pipeline.backend.describe()["connects"] == 1
    finally:
        proxy.close()


def test_a_peer_that_drops_every_handshake_fails_within_the_connect_limit(
    peer: Any, connect: Any
) -> None:
    proxy = Proxy(peer.address, drop=1 << 30)
    try:
        pipeline = connect(address=proxy.address, transport__options__connect_timeout_s=0.5)
        with pytest.raises(BackendUnavailableError, match=r"before it answered HELLO within"):
            geo = geometry(pages=4, name="never")
            pipeline.register_pool("never", geo, pool_buffer(geo))
    finally:
        proxy.close()
