"""The host part of a ``HOST:PORT`` address, checked the same way wherever one is given.

Three places take an address (``transport.options.peer`` and ``serve --listen``, ``--metrics``,
Mooncake's ``master``), each cutting it at its last ``:``; what is left must be an IP address,
a bracketed IPv6 address (``[::1]``, brackets balanced) or a host name (RFC 1123 labels of
letters, digits and ``-``, at most 253 characters), so that ``[::1``, ``a:b`` or a name with
spaces is refused where it is written instead of failing later inside a resolver.
"""

from __future__ import annotations

import ipaddress
import re

from ..values import shorten

__all__ = ["host_part", "host_port"]

_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_NAME = re.compile(rf"(?=.{{1,253}}\Z){_LABEL}(?:\.{_LABEL})*\.?", re.ASCII)


def host_part(raw: str, *, text: str, where: str) -> str:
    """``raw`` (the text before an address's last ``:``) as a host: brackets removed from an
    IPv6 address; ValueError naming ``where`` and the whole ``text`` when it is none."""
    if raw.startswith("[") or raw.endswith("]"):
        inner = raw[1:-1]
        if raw.startswith("[") and raw.endswith("]"):
            try:
                ipaddress.IPv6Address(inner)
            except ValueError:
                pass
            else:
                return inner
        message = (
            f"{where}: {shorten(raw)} in {shorten(text)} is not a bracketed IPv6 address; "
            "write [IPV6]:PORT, e.g. [::1]:7480"
        )
        raise ValueError(message)
    try:
        ipaddress.ip_address(raw)
    except ValueError:
        if _NAME.fullmatch(raw):
            return raw
        message = (
            f"{where}: {shorten(raw)} in {shorten(text)} is neither an IP address nor a host "
            "name (letters, digits, '-' and '.'); an IPv6 address goes in brackets: [::1]:7480"
        )
        raise ValueError(message) from None
    return raw


def host_port(
    text: str, *, where: str, example: str = "127.0.0.1:7480", low_port: int = 0
) -> tuple[str, int]:
    """``"host:port"`` (``"[v6]:port"`` for IPv6) -> ``(host, port)``, the port from
    ``low_port`` to 65535; ValueError naming ``where`` (and ``example``, the form) says why."""
    host, sep, port_text = text.strip().rpartition(":")
    if not sep or not host:
        message = f"{where}: expected HOST:PORT (e.g. {example}), got {shorten(text)}"
        raise ValueError(message)
    host = host_part(host, text=text, where=where)
    try:
        port = int(port_text)
    except ValueError:
        message = (
            f"{where}: port must be an integer in {low_port}..65535, got {shorten(port_text)} "
            f"in {shorten(text)}"
        )
        raise ValueError(message) from None
    if not low_port <= port <= 65535:
        message = f"{where}: port must be in {low_port}..65535, got {port} in {shorten(text)}"
        raise ValueError(message)
    return host, port
