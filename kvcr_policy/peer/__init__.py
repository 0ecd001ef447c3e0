"""The peer tier: ``kvcr-policy serve`` and the client side of the ``ucx`` transport.

Module map (each owns one thing): :mod:`.options` the options model, :mod:`.env` UCX
environment knobs, :mod:`.host` same-host detection, :mod:`.protocol` framing and bounded
readers, :mod:`.messages` the messages, :mod:`.plan` the wire descriptor plan, :mod:`.engine`
the UCX worker thread, :mod:`.channel` a framed control socket, :mod:`.tiers` and
:mod:`.session` and :mod:`.server` the server, :mod:`.addrcheck` worker-address validation,
:mod:`.connection`, :mod:`.ops`, :mod:`.client` and :mod:`.pool` the client, :mod:`.cli` the
``serve`` command and :mod:`.bench` the ucx benchmark. Importing this package never imports
ucxx.
"""

from __future__ import annotations

from .options import UcxOptions

__all__ = ["UcxOptions"]
