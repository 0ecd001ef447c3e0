"""What a server's tier is called on ``/metrics``: label values that are valid, bounded, name
no tenant unless the operator asks, and cannot be one another tenant's.

A tier's label is ``POOL`` on a server with one tenant (its own secret, or ``--insecure``), and
``TENANT/POOL`` on a server with a tenants folder, for every tenant (a tenant file named
``default`` once got unprefixed labels, and its pool named ``team-b/kv`` overwrote team-b's
gauges). ``POOL`` is the pool's name when it is 1 to 64 of ``A-Z a-z 0-9 . _ : -``, else
``pool-`` and 8 hex digits of its SHA-256 (the client chooses the name: up to 256 bytes of
anything, which a scrape would otherwise carry), and each tenant gets at most 16 distinct
``POOL`` values, its tiers past them sharing ``other`` (a tenant may hold up to 1024 tiers:
:mod:`kvcr_policy.observability.labels`, which logs what each label stands for; tiers that
share a label add up on ``/metrics``). ``TENANT`` is the tenant's name only with
``observability.tenant_labels``, else ``tenant-`` and 8 hex digits of an HMAC of a fixed text
keyed by the tenant's secret (the same across restarts; only someone who holds the secret can
tell which tenant it stands for, neither its name nor the key id a HELLO carries). Neither part
contains ``/``, so no pool of one tenant can take another's label.
"""

from __future__ import annotations

import hmac
import threading
from collections.abc import Mapping

from kvcr_policy.observability.labels import PoolLabels, pool_label

from ..credentials import Keyring

__all__ = ["TierLabels", "pool_label", "tenant_labels"]


class TierLabels:
    """The label of each tier of one server: its tenant's prefix (``prefixes``, from
    :func:`tenant_labels`) and its pool's label among that tenant's (module docstring)."""

    def __init__(self, prefixes: Mapping[str, str] | None = None) -> None:
        self._prefixes = dict(prefixes or {})
        self._pools: dict[str, PoolLabels] = {}
        self._lock = threading.Lock()

    def get(self, tenant: str) -> str | None:
        """The label prefix of ``tenant``; None on a server with one tenant."""
        return self._prefixes.get(tenant)

    def tier(self, tenant: str, pool: str) -> str:
        """The label of ``tenant``'s tier of pool ``pool``."""
        prefix = self._prefixes.get(tenant)
        with self._lock:
            labels = self._pools.get(tenant)
            if labels is None:
                owner = "the server" if prefix is None else f"tenant label {prefix!r}"
                labels = self._pools[tenant] = PoolLabels(owner)
        label = labels.label(pool)
        return label if prefix is None else f"{prefix}/{label}"


def _opaque(secret: bytes) -> str:
    return "tenant-" + hmac.new(secret, b"kvcr-policy metrics label", "sha256").hexdigest()[:8]


def tenant_labels(keyring: Keyring, tenants_dir: bool, named: bool) -> dict[str, str]:
    """The label prefix of each tenant; empty for a server with one tenant of its own."""
    if not tenants_dir or keyring.insecure:
        return {}
    return {t.name: t.name if named else _opaque(t.secret) for t in keyring.tenants.values()}
