"""ObjectPlan: how one pool's pages become Mooncake objects, straight from pool memory.

One page is one object, its bytes the page's fragments in plane order (as
:func:`kvcr_policy.geometry.fragment_offsets` lists them). The pool itself is registered with
the store, so the batch calls move bytes directly between pool memory and the segments:

- a page that is one contiguous run of the pool (MLA ``page_first`` and
  ``page_first_direct``) moves with ``batch_put_from`` / ``batch_get_into``, one buffer per key;
- any other layout (MHA ``page_first``: K and V apart; ``layer_first``: one fragment per layer
  and side) moves with the ``*_multi_buffers`` calls, each key gathered from, or scattered to,
  its fragments in place. No staging copy either way, unless ``backend.options.staging``
  sends such pages through a staging area (:mod:`.staging`): the same bytes, one buffer.

Object keys are ``<pool>@<layout digest>/<key>``, ``<pool>@<layout digest>@<tenant>/<key>`` for
a tenant other than ``default`` (``backend.options.tenant``), and the probe objects of a pool
``<namespace>#probe/...``:

- clients whose pools lay a page out differently never read each other's bytes (a smaller
  object would otherwise land partly in a larger page);
- clients of different tenants never read, overwrite or clear each other's objects, whether
  or not the master enforces tenants (:mod:`.master`);
- the pool's name and the tenant are percent-encoded (:func:`kvcr_policy.plugin_api.key_part`):
  neither holds ``@``, ``/`` or ``#``, so the namespace ends at the first ``/`` or ``#`` and no
  key of one pool is a key of another (a pool named ``kva@<digest>/x`` once wrote keys that
  pool ``kva`` read as its own, and its ``clear()`` removed them). The names of most pools
  (``kv``, ``v0.4096``) are unchanged by the encoding.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvcr_policy.plugin_api import PoolGeometry, fragment_offsets, key_part

__all__ = ["DEFAULT_TENANT", "ObjectPlan"]

# The geometry fields that decide a page's bytes (tokens, name and device do not).
_LAYOUT_FIELDS = ("layout", "layers", "heads", "head_dim", "dtype", "page_size", "mla")


def layout_digest(geometry: PoolGeometry) -> str:
    text = "|".join(f"{name}={getattr(geometry, name)}" for name in _LAYOUT_FIELDS)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


#: The tenant whose keys carry no tenant part (Mooncake's own default tenant id).
DEFAULT_TENANT = "default"


def _regex(text: str) -> str:
    """``text``, made of key_part's characters and ``@``, as an ECMAScript regular expression
    matching itself (``.`` is the only one of them special there)."""
    return text.replace(".", "\\.")


@dataclass(frozen=True)
class ObjectPlan:
    """Keys and buffers of one pool; see the module docstring."""

    name: str
    geometry: PoolGeometry
    address: int
    tenant: str = DEFAULT_TENANT

    @property
    def namespace(self) -> str:
        namespace = f"{key_part(self.name)}@{layout_digest(self.geometry)}"
        if self.tenant != DEFAULT_TENANT:
            namespace += "@" + key_part(self.tenant)
        return namespace

    @property
    def multi(self) -> bool:
        """Whether a page needs the multi-buffer calls (it is not one run of the pool)."""
        return self.geometry.fragments_per_page > 1

    @property
    def pattern(self) -> str:
        """A regular expression matching every object of this pool (pages and probes)."""
        return "^" + _regex(self.namespace) + "[/#]"

    def keys(self, keys: list[str]) -> list[str]:
        prefix = self.namespace + "/"
        return [prefix + key for key in keys]

    def probe_key(self, client: str, nbytes: int, piece: int) -> str:
        """Piece ``piece`` of a client's limit probe of ``nbytes``; never a page key ('#')."""
        return f"{self.namespace}#probe/{client}/{nbytes}/{piece}"

    def buffers(self, pages: np.ndarray) -> tuple[list[Any], list[Any]]:
        """Per page, where its bytes are in the pool: ``(pointers, sizes)``, each a list of
        ints (one run per page) or of lists of ints (one per fragment, plane order)."""
        g = self.geometry
        offsets = fragment_offsets(g, pages)  # (planes, n)
        if not self.multi:
            return (self.address + offsets[0]).tolist(), [g.page_bytes] * len(pages)
        pointers = (self.address + offsets.T).tolist()
        sizes = [[g.fragment_bytes] * g.fragments_per_page] * len(pages)
        return pointers, sizes
