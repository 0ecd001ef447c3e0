"""The tier a server shares with this process: its memfd mapped here, and the copy endpoints.

On a shared-memory connection each ATTACHED brings the tier's memfd (``SCM_RIGHTS``); the
client maps it and from then on moves pages by memory copy between that mapping and the pool.
The numpy view returned keeps the mapping alive, so a copy still running (its endpoints hold
the view) never reads or writes unmapped memory, whatever happens to the connection; the
mapping goes when the last view does.
"""

from __future__ import annotations

import mmap
import os
import stat

import numpy as np

from kvcr_policy.errors import TransportError

__all__ = ["map_tier"]


def map_tier(fd: int | None, offset: int, nbytes: int, expected: int, peer: str) -> np.ndarray:
    """A uint8 view of the ``nbytes`` tier bytes at ``offset`` of memfd ``fd`` (closed here);
    TransportError unless it is a regular file holding them and ``nbytes == expected``."""
    if fd is None:
        raise TransportError(f"peer {peer}: ATTACHED came without the tier's shared memory")
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise TransportError(f"peer {peer}: the tier passed is not a memory file")
        if nbytes != expected or offset < 0 or offset + nbytes > info.st_size:
            message = (
                f"peer {peer}: the tier passed holds {info.st_size} bytes; expected {expected} "
                f"at offset {offset} (ATTACHED says {nbytes})"
            )
            raise TransportError(message)
        try:
            mapping = mmap.mmap(fd, info.st_size, flags=mmap.MAP_SHARED)
        except OSError as err:
            raise TransportError(f"peer {peer}: cannot map the tier: {err}") from None
    finally:
        os.close(fd)
    return np.frombuffer(mapping, dtype=np.uint8, count=nbytes, offset=offset)
