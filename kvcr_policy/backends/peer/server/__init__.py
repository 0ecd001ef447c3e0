"""The serve side of the peer tier: ``kvcr-policy serve`` holds tiers that clients read and write.

- :mod:`.server`: :class:`~.server.PeerServer`: the listener, the sessions, the tiers, the
  lifetime (start, graceful stop)
- :mod:`.admission`: handshake slots, sessions per tenant and in all, the frame budget
- :mod:`.handshake`: HELLO, CHALLENGE, AUTH: a client proves it holds a tenant's secret
  before it reaches anything else
- :mod:`.session`: one client connection: its tenant, attached pools, dispatch, liveness
- :mod:`.transfers`: the claims (reads) and reservations (writes) a session holds, and the
  check of the client's descriptor lists before a byte moves
- :mod:`.tiers`: one region and one store per tenant, pool name and layout
- :mod:`.addrcheck`: worker-address validation in a helper process, tenants in turn
  (``python -m kvcr_policy.backends.peer.server.addrcheck``)

It never imports the client side (:mod:`kvcr_policy.backends.peer.client`).
"""
