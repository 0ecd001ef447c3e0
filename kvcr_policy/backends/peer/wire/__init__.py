"""The peer wire format: framing, bounded payloads, the messages, and what a descriptor list
must cover. Both sides import it; it imports neither.

A conversation (c: client, s: server)::

    c HELLO    -> s WELCOME          versions, capabilities, host ids, UCX worker addresses
    c ATTACH   -> s ATTACHED         a pool geometry -> the tier that mirrors it
    c EXISTS   -> s COUNT            one round trip per metadata-query batch
    c CLAIM    -> s CLAIMED          slots of the leading present run, claimed on the server
    c SEND     -> s SENT             the client shaped the descriptors and posted receives; it
                                     names each one's tier bytes; s checks, sends, releases
    c RESERVE  -> s RESERVED         slots for a write (nothing posted yet)
    c POST     -> s POSTED           the client's shaped descriptors (tier bytes); s checks,
                                     posts receives into the slots, names the tag base
    c COMMIT   -> s WRITTEN          client's sends finished; server publishes what arrived
    c RELEASE                        client will not read a claim / write a reservation
    c DELETE / CLEAR -> s COUNT
    c STATS    -> s STATS_REPLY
    c PROBE    -> s SENT             one message of N bytes (the benchmark's limit)
    c PING     -> s PONG
    s ERROR                          a refused request (connection stays) or a closing one

Data never travels in frames: it moves as UCX tag messages ``tag_base + i``, one per
descriptor ``i`` of the list the client shaped with its coalescing strategy, straight between
pool memory and tier slots (the receiver posts into them before the sender sends). The server
moves only a list that covers exactly the bytes of the slots it claimed or reserved for that
request (:mod:`.coverage`), so a buggy or hostile list can never read another slot nor publish
a partly written page.

Modules: :mod:`.framing` (header, frames), :mod:`.payload` (bounded reader and writer),
:mod:`.fields` (field types with their codecs), :mod:`.message` (types, base, encode/decode),
:mod:`.messages` (the messages), :mod:`.coverage` (descriptor lists: checks and outcomes).
"""

from __future__ import annotations

from . import messages

__all__ = ["messages"]
