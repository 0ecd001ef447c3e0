"""The client side of the peer tier: what a pipeline process uses to reach ``kvcr-policy serve``.

- :mod:`.client`: :class:`~.client.PeerClient`: one peer: connect, reconnect, run ops
- :mod:`.connection`: one control socket and its UCX endpoint, requests and replies
- :mod:`.ops`: read, write, probe on a connection, with descriptors shaped by the caller
- :mod:`.pool`: :class:`~.pool.PeerPool`: one pool whose tier lives on the peer

It never imports the serve side (:mod:`kvcr_policy.backends.peer.server`).
"""
