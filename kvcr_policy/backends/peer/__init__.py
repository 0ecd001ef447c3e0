"""The peer tier: what ``kvcr-policy serve`` runs and the ``peer`` backend (transport ``ucx``).

Module map (each owns one thing)::

    peer/
      options.py     UcxOptions: [transport.options] of ucx and of serve
      env.py         UCX environment knobs, applied where the user has not spoken
      host.py        host id (same host id: shared memory can work), interface of an address
      auth.py        key ids, nonces, the HMAC proofs of the handshake (both sides)
      credentials.py where a process's secret comes from; a server's tenants
      loop.py        an event loop on its own thread: calls, timers, watched sockets
      worker.py      the UCX worker thread: the one UCX worker, the one thread calling UCX
      requests.py    request groups (one transfer's UCX requests), timers, memory views
      channel.py     one framed, bounded control socket
      wire/          the wire format, imported by both sides (its docstring: the conversation)
        framing.py     header and frames
        payload.py     bounded payload reader and writer, the limits
        fields.py      field types annotated with their codecs
        message.py     message types, error codes, the @message base, encode/decode
        messages.py    the messages, each field declared once
        coverage.py    what a shaped descriptor list must cover; which pages a failure fails
      server/        the serve side (never imports client/)
        server.py      PeerServer: listener, sessions, tiers, lifetime
        admission.py   handshake slots (by key id and address), sessions per tenant
        budget.py      the frame budget: bytes of partial frames, shared fairly by tenants
        handshake.py   HELLO, CHALLENGE, AUTH: nothing else before a client authenticates
        session.py     one client connection: its tenant, attached pools, dispatch, liveness
        transfers.py   claims and reservations in flight; descriptor lists checked first
        tiers.py       one region and store per tenant, pool name and layout
        addrcheck.py   worker-address validation in a helper process, tenants in turn
      client/        the client side (never imports server/)
        client.py      PeerClient: one peer: connect, reconnect, run ops
        connection.py  one control socket and UCX endpoint: requests, replies, failure
        ops.py         read, write, probe, with descriptors shaped by the caller
        pool.py        PeerPool: one pool whose tier is on the peer
      transport.py   the ucx transport name and its options (the peer backend uses them)
      backend.py     PeerBackend: owns the UCX worker and PeerClient, builds each PeerPool
      serve.py       serve(setup): a tier served from this process (kvcr_policy.cli.serve runs it)

Importing this package never imports ucxx; the worker thread imports it, after the
environment knobs are applied.
"""

from __future__ import annotations

from .options import UcxOptions

__all__ = ["UcxOptions"]
