"""One rule for the host of every HOST:PORT a user writes (red team 2026-12-b, B8: Mooncake's
``master = '[::1'`` passed validation): the peer's address, ``--metrics`` and the master."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kvcr_policy.backends.peer.options import parse_address
from kvcr_policy.config.hosts import host_part
from kvcr_policy.observability.exposition import parse_listen

PARSERS: dict[str, Callable[[str], tuple[str, int]]] = {
    "peer": parse_address,
    "metrics": parse_listen,
}


def _mooncake(text: str) -> tuple[str, int]:
    from kvcr_policy_mooncake.options import split_address

    return split_address(text)


@pytest.mark.parametrize("parser", ["peer", "metrics", "mooncake"])
@pytest.mark.parametrize(
    "text", ["[::1:80", "::1]:80", "[x]:80", "a b:80", "a:b:80", "host\x00:80", "-bad-:80"]
)
def test_malformed_hosts_are_refused_everywhere(parser: str, text: str) -> None:
    parse = PARSERS.get(parser, _mooncake)
    with pytest.raises(ValueError, match=r"bracketed IPv6|neither an IP address nor a host name"):
        parse(text)


@pytest.mark.parametrize(
    ("raw", "host"),
    [
        ("127.0.0.1", "127.0.0.1"),
        ("[::1]", "::1"),
        ("::1", "::1"),
        ("node-7.example", "node-7.example"),
    ],
)
def test_hosts_that_resolve_are_kept(raw: str, host: str) -> None:
    assert host_part(raw, text=f"{raw}:1", where="x") == host
