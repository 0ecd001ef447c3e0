"""The peer tier: ``kvcr-policy serve`` and the client side of the ``ucx`` transport.

Module map (each owns one thing):

- configuration: :mod:`.options` (the options model), :mod:`.env` (UCX environment knobs),
  :mod:`.host` (same-host detection)
- wire: :mod:`.protocol` (framing, bounded readers), :mod:`.wire` (kinds, codecs,
  encode/decode), :mod:`.messages` (the messages), :mod:`.plan` (the wire descriptor plan)
- runtime: :mod:`.loop` (an event loop thread), :mod:`.engine` (the UCX worker on it),
  :mod:`.requests` (request groups), :mod:`.channel` (a framed control socket)
- server: :mod:`.server`, :mod:`.session`, :mod:`.serving` (claims and reservations),
  :mod:`.tiers`, :mod:`.addrcheck` (worker-address validation in a helper process)
- client: :mod:`.client`, :mod:`.connection`, :mod:`.ops` (read, write, probe),
  :mod:`.pool` (the RemotePool the pipeline delegates to)
- commands: :mod:`.cli` (``serve``), :mod:`.bench` (the ucx benchmark)

Importing this package never imports ucxx; the engine imports it on its own thread, after the
environment knobs are applied.
"""

from __future__ import annotations

from .options import UcxOptions

__all__ = ["UcxOptions"]
