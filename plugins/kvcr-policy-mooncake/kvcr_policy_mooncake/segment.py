"""A process that only contributes memory to Mooncake Store: where pages live in benchmarks.

``python -m kvcr_policy_mooncake.segment --master HOST:PORT --segment-bytes 2GiB`` joins the
store with a segment of that size, prints one JSON line (``{"segment": "HOST:PORT", ...}``:
its segment's name, usable as ``backend.options.preferred_segment``), then holds the segment
until SIGTERM or SIGINT. :class:`SegmentProcess` runs it as a child, stopped by PID.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from typing import Any

from pydantic import ByteSize, TypeAdapter

from kvcr_policy.plugin_api import TransportError

from .master import child_setup

__all__ = ["SegmentProcess", "main"]


class SegmentProcess:
    """``python -m kvcr_policy_mooncake.segment`` as a child; ``segment`` once it holds one."""

    def __init__(self, master: str, segment_bytes: int, *, timeout: float = 60.0) -> None:
        command = [
            sys.executable,
            "-m",
            "kvcr_policy_mooncake.segment",
            "--master",
            master,
            "--segment-bytes",
            str(segment_bytes),
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


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--master", required=True, help="HOST:PORT of mooncake_master")
    parser.add_argument("--segment-bytes", required=True, help="segment size, e.g. 2GiB")
    parser.add_argument("--local-hostname", default="auto", help="address others reach it at")
    parser.add_argument("--connect-timeout-s", type=float, default=10.0)
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
    )
    client = StoreClient(options, lambda path: "the command line")
    try:
        print(json.dumps({"segment": client.hostname, "segment_bytes": size}), flush=True)
        signal.sigwait({signal.SIGTERM, signal.SIGINT})
    finally:
        client.close()


if __name__ == "__main__":
    main()
