"""The serve side of the peer tier: ``kvcr-policy serve`` holds tiers that clients read and write.

- :mod:`.server`: :class:`~.server.PeerServer`: the listener, the sessions, the tiers, the
  lifetime (start, graceful stop)
- :mod:`.session`: one client connection: handshake, attached pools, dispatch
- :mod:`.transfers`: the claims (reads) and reservations (writes) a session holds, and the
  check of the client's descriptor lists before a byte moves
- :mod:`.tiers`: one region and one store per pool name and layout
- :mod:`.addrcheck`: worker-address validation in a helper process
  (``python -m kvcr_policy.backends.peer.server.addrcheck``)

It never imports the client side (:mod:`kvcr_policy.backends.peer.client`).
"""
