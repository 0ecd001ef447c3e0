"""Pool names as metric label values: valid, bounded in length, and bounded in number per owner.

Whoever registers a pool names it (an engine in a pipeline; a tenant's client on a peer
server, up to 256 bytes of anything), and each label value is a set of series on ``/metrics``
that never goes away while its process runs. So:

- a pool's label is its name when that is 1 to 64 of ``A-Z a-z 0-9 . _ : -``, else ``pool-``
  and 8 hex digits of the name's SHA-256 (:func:`pool_label`);
- one owner (a pipeline, a tenant of a peer server) gets at most :data:`MAX_POOL_LABELS`
  labels of its pools' own; its pools past them share the label :data:`OTHER`, whose series
  add theirs up (:class:`PoolLabels`). 60 pools of long names once grew a server's
  ``/metrics`` from 103 to 9,527 lines, and a tenant may hold up to 1024 tiers;
- every label that is not the pool's own name is logged once, with the name it stands for, so
  a dashboard's ``pool-1a2b3c4d`` or ``other`` can be traced back.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading

from ..values import shorten

__all__ = ["MAX_POOL_LABELS", "OTHER", "PoolLabels", "pool_label"]

log = logging.getLogger("kvcr_policy.observability")

#: Distinct pool labels one owner gets: an engine's pools (SGLang's kv, mamba, swa and up to
#: 8 object sizes of its tensor API) fit; a client making names up does not grow /metrics.
MAX_POOL_LABELS = 16
#: The label of an owner's pools past :data:`MAX_POOL_LABELS`.
OTHER = "other"

_POOL = re.compile(r"[A-Za-z0-9._:-]{1,64}", re.ASCII)


def pool_label(name: str) -> str:
    """The label value of a pool named ``name``: the name itself when it is a short, plain
    one, else ``pool-`` and 8 hex digits of its SHA-256 (see the module docstring)."""
    if _POOL.fullmatch(name) and name != OTHER:
        return name
    return "pool-" + hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:8]


class PoolLabels:
    """The pool labels of one owner (``owner`` says whose, in the log); thread-safe."""

    def __init__(self, owner: str, limit: int = MAX_POOL_LABELS) -> None:
        self.owner = owner
        self.limit = limit
        self._labels: dict[str, str] = {}
        self._given: set[str] = set()
        self._lock = threading.Lock()

    def label(self, name: str) -> str:
        """The label of pool ``name``: the same for the same name, at most ``limit`` distinct
        ones before :data:`OTHER`."""
        with self._lock:
            label = self._labels.get(name)
            if label is not None:
                return label
            label = pool_label(name)
            if label not in self._given and len(self._given) >= self.limit:
                label = OTHER
            self._given.add(label)
            self._labels[name] = label
        if label != name:
            why = (
                f"{self.owner} has {self.limit} pool labels already"
                if label == OTHER
                else "its name is no plain label value"
            )
            log.info("metrics label pool=%r stands for pool %s (%s)", label, shorten(name), why)
        return label
