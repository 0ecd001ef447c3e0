"""A process that only contributes memory to Mooncake Store: where pages live in benchmarks.

``python -m kvcr_policy_mooncake.segment --master HOST:PORT --segment-bytes 2GiB`` joins the
store with a segment of that size, prints one JSON line (``{"segment": "HOST:PORT", ...}``:
its segment's name, usable as ``backend.options.preferred_segment``), then holds the segment
until SIGTERM or SIGINT. :class:`SegmentProcess` runs it as a child, stopped by PID.

``--prefault`` touches the whole segment before the JSON line: the holder stores objects into
its own segment until it is full, then removes them. Mooncake maps a segment without touching
it, so otherwise the first put into each part of it pays that memory's page faults: on a
2-core machine, puts into a fresh 2 GiB segment ran at 0.33 to 1.3 GB/s and puts into the same
memory once reused at 2.5 GB/s. A benchmark's stores measure the store path only once the
segment is warm, as a long-running holder's is; the JSON line says how long it took
(``prefault_s``) and how many bytes it touched (``prefaulted_bytes``).
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import ByteSize, TypeAdapter

from kvcr_policy.plugin_api import TransportError

from .master import child_setup

if TYPE_CHECKING:
    from .client import StoreClient

__all__ = ["SegmentProcess", "main"]

#: Size of each object of a prefault: large enough to be few calls, small enough that the
#: last ones fill what remains of the segment.
_FILL_BYTES = 16 << 20


class SegmentProcess:
    """``python -m kvcr_policy_mooncake.segment`` as a child; ``segment`` once it holds one."""

    def __init__(
        self, master: str, segment_bytes: int, *, timeout: float = 60.0, prefault: bool = False
    ) -> None:
        command = [
            sys.executable,
            "-m",
            "kvcr_policy_mooncake.segment",
            "--master",
            master,
            "--segment-bytes",
            str(segment_bytes),
            *(["--prefault"] if prefault else []),
        ]
        self.proc = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=child_setup(),
        )
        self.log: list[str] = []
        self._drainer = threading.Thread(target=self._drain, daemon=True)
        self._drainer.start()
        line: list[str] = []
        reader = threading.Thread(
            target=lambda: line.append(self.proc.stdout.readline()),  # type: ignore[union-attr]
            daemon=True,
        )
        reader.start()
        reader.join(timeout)
        if not line or not line[0]:
            self.stop()
            self._drainer.join(5.0)
            tail = "\n".join(self.log[-20:])
            raise TransportError(f"the segment process did not start within {timeout} s:\n{tail}")
        self.info: dict[str, Any] = json.loads(line[0])
        self.segment: str = self.info["segment"]

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line.rstrip())

    @property
    def pid(self) -> int:
        return self.proc.pid

    def kill(self) -> None:
        """SIGKILL, as a crash: its segment's pages fail to read from then on."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def prefault(client: StoreClient, segment_bytes: int) -> int:
    """Store objects into the client's own segment until it holds no more, then remove them:
    every byte the master can place there has been written once. Returns the bytes stored."""
    size = min(_FILL_BYTES, segment_bytes)
    source = np.zeros(size, dtype=np.uint8)
    address = int(source.ctypes.data)
    if client.register(address, size) != 0:
        return 0
    keys: list[str] = []
    try:
        while len(keys) * size < segment_bytes:
            key = f"kvcr-policy/segment-prefault/{client.hostname}/{len(keys)}"
            if client.put([key], [address], [size], multi=False) != [0]:
                break  # full (or refused): what was stored has been touched
            keys.append(key)
    finally:
        if keys:
            client.remove(keys, force=True)
        client.unregister(address)
    return len(keys) * size


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--master", required=True, help="HOST:PORT of mooncake_master")
    parser.add_argument("--segment-bytes", required=True, help="segment size, e.g. 2GiB")
    parser.add_argument("--local-hostname", default="auto", help="address others reach it at")
    parser.add_argument("--connect-timeout-s", type=float, default=10.0)
    parser.add_argument(
        "--prefault", action="store_true", help="touch the whole segment before announcing it"
    )
    args = parser.parse_args(argv)
    size = int(TypeAdapter(ByteSize).validate_python(args.segment_bytes))
    # Signals first: a SIGTERM that arrives during setup still ends the process cleanly.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    from .client import StoreClient
    from .options import MooncakeOptions

    options = MooncakeOptions(
        master=args.master,
        segment_bytes=ByteSize(size),
        local_hostname=args.local_hostname,
        connect_timeout_s=args.connect_timeout_s,
        preferred_segment="local" if args.prefault else None,  # the prefault's objects
    )
    client = StoreClient(options, lambda path: "the command line")
    try:
        info: dict[str, Any] = {"segment": client.hostname, "segment_bytes": size}
        if args.prefault:
            start = time.monotonic()
            info["prefaulted_bytes"] = prefault(client, size)
            info["prefault_s"] = round(time.monotonic() - start, 3)
        print(json.dumps(info), flush=True)
        signal.sigwait({signal.SIGTERM, signal.SIGINT})
    finally:
        client.close()


if __name__ == "__main__":
    main()
