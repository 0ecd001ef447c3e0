"""A client that dies while UCX is still wiring its endpoint up (run as a child process).

``python -m tests.backends.peer.dying_client HOST:PORT PROGRESS``: the handshake by hand (raw
control socket, this host's id, so the server picks shared memory), then an endpoint to the
server's worker and a 1 MiB tag send (a rendezvous: UCX sends a wire-up request to learn the
server's endpoint), ``PROGRESS`` calls of ucp_worker_progress, and SIGKILL of itself. The
server handles that request after this process is gone: its shared-memory segment can no
longer be opened.
"""

from __future__ import annotations

import os
import signal
import sys

from kvcr_policy.backends.peer.env import apply_env
from kvcr_policy.backends.peer.host import host_id
from kvcr_policy.backends.peer.options import UcxOptions
from kvcr_policy.backends.peer.wire import messages as m
from tests.backends.peer.raw_client import Raw, default_secret, hello


def main(address: str, progress: int) -> None:
    apply_env(UcxOptions())  # the UCX settings a library client of this process would use
    import numpy as np
    import ucxx._lib.libucxx as ucx
    from ucxx._lib.arr import Array

    context = ucx.UCXContext(feature_flags=(ucx.Feature.TAG, ucx.Feature.WAKEUP))
    worker = ucx.UCXWorker(context)
    raw = Raw(address, timeout=60.0)
    opening = hello(default_secret())
    opening = m.Hello(
        opening.capabilities,
        0,  # tls auto: the server picks shared memory for a client of its own host
        opening.heartbeat_ms,
        opening.op_timeout_ms,
        host_id(),
        "dying",
        opening.key_id,
        opening.nonce,
    )
    welcome = raw.handshake_with(opening, default_secret(), worker.address.tobytes())
    if not isinstance(welcome, m.Welcome) or welcome.tls != 1:
        print(f"no shared-memory WELCOME: {welcome!r}", flush=True)
        sys.exit(3)
    remote = ucx.UCXAddress.create_from_buffer(welcome.address)
    ep = ucx.UCXEndpoint.create_from_worker_address(worker, remote, False)
    data = Array(np.ones(1 << 20, dtype=np.uint8))
    request = ep.tag_send(data, ucx.UCXXTag(1))
    for _ in range(progress):
        worker.progress()
    print("dying", flush=True)
    del request
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
