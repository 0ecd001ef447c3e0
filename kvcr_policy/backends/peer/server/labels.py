"""What a server's tier is called on ``/metrics``: label values that are valid, bounded, name
no tenant unless the operator asks, and cannot be one another tenant's.

A tier's label is ``POOL`` on a server with one tenant (its own secret, or ``--insecure``), and
``TENANT/POOL`` on a server with a tenants folder, for every tenant (a tenant file named
``default`` once got unprefixed labels, and its pool named ``team-b/kv`` overwrote team-b's
gauges). ``POOL`` is the pool's name when it is 1 to 64 of ``A-Z a-z 0-9 . _ : -``, else
``pool-`` and 8 hex digits of its SHA-256 (the client chooses the name: up to 256 bytes of
anything, which a scrape would otherwise carry); ``TENANT`` is the tenant's name only with
``observability.tenant_labels``, else ``tenant-`` and 8 hex digits of an HMAC of a fixed text
keyed by the tenant's secret (the same across restarts; only someone who holds the secret can
tell which tenant it stands for, neither its name nor the key id a HELLO carries). Neither part
contains ``/``, so no pool of one tenant can take another's label.
"""

from __future__ import annotations

import hashlib
import hmac
import re

from ..credentials import Keyring

__all__ = ["pool_label", "tenant_labels"]

_POOL = re.compile(r"[A-Za-z0-9._:-]{1,64}", re.ASCII)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:8]


def pool_label(name: str) -> str:
    """The label part a pool named ``name`` gets (see the module docstring)."""
    if _POOL.fullmatch(name):
        return name
    return "pool-" + _digest(name.encode("utf-8", "surrogatepass"))


def _opaque(secret: bytes) -> str:
    return "tenant-" + hmac.new(secret, b"kvcr-policy metrics label", "sha256").hexdigest()[:8]


def tenant_labels(keyring: Keyring, tenants_dir: bool, named: bool) -> dict[str, str]:
    """The label prefix of each tenant; empty for a server with one tenant of its own."""
    if not tenants_dir or keyring.insecure:
        return {}
    return {t.name: t.name if named else _opaque(t.secret) for t in keyring.tenants.values()}
