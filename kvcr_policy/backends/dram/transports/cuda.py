"""The cuda transport: GPU pools, a DMA-registered (pinned) tier, copies on a dedicated stream.

Each tier region is registered for DMA when its pool registers (:mod:`.cuda_pinned`) and
unregistered only after every copy that could touch it completed. A batch is enqueued on the
transport's stream of the pool's device, by copies, gather kernels or the staging ring
(:mod:`.cuda_paths`, counted in :meth:`describe`); one event is recorded after it, and its
future completes with that event (a completion thread waits on events in submission order,
with the GIL released). torch is imported when a transport is built, never at import: without
CUDA, building one raises :class:`CudaUnavailableError` ("no CUDA device visible").
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import Counter
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import nullcontext
from typing import Any

from kvcr_policy.config.schema import PolicyConfig
from kvcr_policy.errors import ClosedError, CudaUnavailableError, TransportError
from kvcr_policy.memory.cpus import spread_thread
from kvcr_policy.memory.cuda import NO_CUDA, require_cuda
from kvcr_policy.memory.locality import DeviceLocality

from .base import CopyBatch, Endpoint, Transport, check_bounds
from .cuda_options import CudaOptions, resolved_calls, resolved_modes
from .cuda_paths import CopyPaths
from .cuda_pinned import Interface, Registration, cuda_locality, register, unregister

__all__ = [
    "NO_CUDA",
    "CudaOptions",
    "CudaTransport",
    "CudaUnavailableError",
    "cuda_locality",
    "require_cuda",
]

log = logging.getLogger("kvcr_policy.backends.dram.transports.cuda")

#: Endpoints whose views are kept (a pipeline has two per pool).
_KNOWN_ENDPOINTS = 64


class CudaTransport(Transport):
    """Moves pages between GPU pools and their pinned tier regions on one stream per device."""

    name = "cuda"
    capabilities = frozenset({"coalesce", "split"})
    devices = frozenset({"cuda"})
    pins_regions = True

    def __init__(self, config: PolicyConfig, options: CudaOptions) -> None:
        super().__init__(workers=1)
        self._torch = torch = require_cuda()
        self.options = options
        # The default follows the coalescing control, so the default profile issues one copy
        # per fragment as upstream does, and a profile that coalesces also gathers.
        self.gather, self.staging, self.whole_slots = resolved_modes(
            options, config.coalescing.strategy
        )
        self.timeout = config.transport.op_timeout_s
        self._cudart = torch.cuda.cudart()
        self._regions: dict[int, Registration] = {}
        self._history: list[dict[str, Any]] = []
        self._streams: dict[int, Any] = {}
        self._issue = threading.Lock()  # one batch enqueued at a time: events in queue order
        self._cond = threading.Condition()
        self._inflight = 0
        self._done: queue.SimpleQueue[tuple[Any, Future[None], list[Any]] | None] = (
            queue.SimpleQueue()
        )
        self._thread: threading.Thread | None = None
        self._paths: Counter[str] = Counter()
        # Views of the endpoints batches name, by identity (a pool's endpoints live as long as
        # the pool): made once, not per batch; dropped when a region detaches.
        self._sides: dict[int, tuple[Endpoint, dict[str, Any], int | None]] = {}
        self.calls = resolved_calls(options, config.coalescing.strategy)
        self._copy = CopyPaths(
            torch, options, self.gather, self.staging, self._count, calls=self.calls
        )

    # ---- regions ------------------------------------------------------------------------

    def attach_region(self, region: Endpoint, pool: Endpoint) -> None:
        """Register the tier region for DMA on the pool's device; the time taken is reported."""
        device = self._device_index(pool)
        registration = register(self._torch, self._cudart, region.address, region.nbytes, device)
        self._regions[region.address] = registration
        self._history.append(registration.report())
        if self.staging != "never":  # the ring's memory is taken here, not in the first copy
            self._copy.ring(device)
        log.info(
            "tier registered for DMA: %d bytes on cuda:%d in %.3f s",
            region.nbytes,
            device,
            registration.seconds,
        )

    def detach_region(self, region: Endpoint) -> None:
        """Unregister once no copy can touch the region; on doubt, keep it (the caller leaks)."""
        registration = self._regions.get(region.address)
        if registration is None:
            return
        self._drain(f"detach of the {registration.nbytes}-byte tier region")
        try:
            self._stream(registration.device).synchronize()
        except Exception as err:
            message = (
                f"cannot confirm that copies touching the {registration.nbytes}-byte tier "
                f"region completed ({err}); it stays registered and mapped"
            )
            raise TransportError(message) from err
        del self._regions[region.address]
        self._sides.clear()
        failed = unregister(self._cudart, registration)
        if failed is not None:
            log.warning("cudaHostUnregister of the tier region failed: %s", failed)

    def pinned(self, region: Endpoint) -> tuple[int, float]:
        registration = self._regions.get(region.address)
        return (0, 0.0) if registration is None else (registration.nbytes, registration.seconds)

    def locate(self, endpoint: Endpoint) -> DeviceLocality | None:
        """The GPU of a CUDA endpoint, located by the PCI address torch reports for it."""
        if not endpoint.device.startswith("cuda"):
            return None
        index = self._device_index(endpoint)
        return cuda_locality(self._torch, index)

    def _device_index(self, endpoint: Endpoint) -> int:
        device = self._torch.device(endpoint.device)
        if device.type != "cuda":
            message = f"expected a CUDA endpoint, got one on {endpoint.device}"
            raise TransportError(message)
        return device.index if device.index is not None else self._torch.cuda.current_device()

    def _stream(self, device: int) -> Any:
        stream = self._streams.get(device)
        if stream is None:
            stream = self._streams[device] = self._torch.cuda.Stream(device=device)
        return stream

    # ---- copies -------------------------------------------------------------------------

    def copy(self, batch: CopyBatch) -> None:
        """Move ``batch`` and wait for it (the pipeline's per-page fallback uses this)."""
        try:
            self.submit(batch).result(timeout=self.timeout)
        except FutureTimeout as err:
            message = f"cuda copy did not complete within transport.op_timeout_s={self.timeout}"
            raise TransportError(message) from err

    def submit(self, batch: CopyBatch) -> Future[None]:
        """Enqueue ``batch`` on its device's stream; the future completes with its event."""
        with self._cond:
            if self._closed:
                raise ClosedError(f"transport {self.name!r} is closed; build a new pipeline")
            self._inflight += 1
        try:
            check_bounds(batch)
            with self._issue:
                event, keep = self._enqueue(batch)
                future: Future[None] = Future()
                self._start_completion()
                self._done.put((event, future, keep))
        except BaseException as err:
            self._settled()
            if isinstance(err, TransportError):
                raise
            raise TransportError(f"cuda copy could not be issued: {err}") from err
        return future

    def read_ahead(
        self, tier: Endpoint, pool: Endpoint, starts: Any, page_bytes: int, fragments: int
    ) -> object | None:
        """Start filling the staging ring from the tier slots at ``starts`` (a read's claimed
        pages, in order) before the read's first batch is planned (:meth:`.CopyPaths.read_ahead`);
        returns the ticket that batch carries to adopt the fills, or None when nothing was read.

        The caller keeps those slots unchanged until it calls :meth:`forget` with the ticket.
        """
        if self.staging == "never" or not pool.device.startswith("cuda"):
            return None
        with self._cond:
            if self._closed:
                return None
        ticket = object()
        with self._issue:
            src, _ = self._side(tier)
            _, device = self._side(pool)
            assert device is not None  # a CUDA endpoint
            stream = self._stream(device)
            # Every copy and event of a read-ahead names its stream: none is entered (on a
            # slow host entering one took 0.1 ms before a small restore's first copy), and
            # the device only where it is not the current one.
            cuda = self._torch.cuda
            guard = nullcontext() if cuda.current_device() == device else cuda.device(device)
            with guard:
                read = self._copy.read_ahead(
                    ticket, src["copy"], starts, page_bytes, fragments, device, stream
                )
        return ticket if read else None

    def forget(self, ticket: object) -> None:
        """Discard what was read ahead for ``ticket``."""
        with self._issue:
            self._copy.forget(ticket)

    def end_bytes(self) -> int | None:
        """Two staging buffers' worth, what a batch on an idle stream plans before its first
        copies (:meth:`.CopyPaths.staged`); None without staging (upstream's batches)."""
        if self.staging == "never":
            return None
        return 2 * int(self.options.staging_buffer_bytes)

    def _enqueue(self, batch: CopyBatch) -> tuple[Any, list[Any]]:
        torch = self._torch
        src, src_device = self._side(batch.src)
        dst, dst_device = self._side(batch.dst)
        device = src_device if dst_device is None else dst_device
        if device is None:
            message = (
                "the cuda transport copies between a GPU buffer and a registered tier region; "
                "both endpoints are host memory"
            )
            raise TransportError(message)
        stream = self._stream(device)
        d = batch.descriptors
        done = stream
        with torch.cuda.stream(stream):
            path = self._copy.path(d)
            staged = self._copy.staged(
                d, src, dst, src_device, dst_device, device, stream, batch.ticket
            )
            if staged is not None:
                path, keep, done = staged
            else:
                restore = dst_device is not None
                path, keep = self._copy.direct(d, src, dst, device, stream, path, restore)
            event = torch.cuda.Event()
            event.record(done)
        with self._cond:
            self._paths[f"{path}.batches"] += 1
            self._paths[f"{path}.descriptors"] += len(d)
            self._paths[f"{path}.bytes"] += d.nbytes
        return event, keep

    def _side(self, endpoint: Endpoint) -> tuple[dict[str, Any], int | None]:
        """Views of one endpoint: ``copy`` (for copy_) and ``mapped`` (a CUDA tensor), device."""
        known = self._sides.get(id(endpoint))
        if known is not None and known[0] is endpoint:
            return known[1], known[2]
        views, device = self._views(endpoint)
        if len(self._sides) < _KNOWN_ENDPOINTS:
            self._sides[id(endpoint)] = (endpoint, views, device)
        return views, device

    def _views(self, endpoint: Endpoint) -> tuple[dict[str, Any], int | None]:
        torch = self._torch
        if endpoint.device.startswith("cuda"):
            device = self._device_index(endpoint)
            buffer = endpoint.buffer
            if isinstance(buffer, torch.Tensor) and buffer.data_ptr() == endpoint.address:
                flat = buffer.detach().reshape(-1).view(torch.uint8)[: endpoint.nbytes]
            else:
                flat = torch.as_tensor(
                    Interface(endpoint.address, endpoint.nbytes), device=f"cuda:{device}"
                )
            return {"copy": flat, "mapped": flat}, device
        for reg in self._regions.values():
            offset = endpoint.address - reg.address
            if offset >= 0 and offset + endpoint.nbytes <= reg.nbytes:
                stop = offset + endpoint.nbytes
                return {"copy": reg.host[offset:stop], "mapped": reg.mapped[offset:stop]}, None
        message = (
            f"host endpoint at {endpoint.address:#x} ({endpoint.nbytes} bytes) is not a tier "
            "region registered by attach_region; the cuda transport copies only pinned memory"
        )
        raise TransportError(message)

    # ---- completion ---------------------------------------------------------------------

    def _start_completion(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._complete, name="kvcr-cuda-events", daemon=True
            )
            self._thread.start()

    def _complete(self) -> None:
        spread_thread()
        while True:
            item = self._done.get()
            if item is None:
                return
            event, future, keep = item
            try:
                event.synchronize()  # releases the GIL while it waits
            except Exception as err:
                future.set_exception(TransportError(f"cuda copy failed: {err}"))
            else:
                future.set_result(None)
            finally:
                keep.clear()
                self._settled()

    def _count(self, name: str, n: int) -> None:
        with self._cond:
            self._paths[name] += n

    def _settled(self) -> None:
        with self._cond:
            self._inflight -= 1
            self._cond.notify_all()

    def _drain(self, why: str) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: self._inflight == 0, timeout=self.timeout):
                message = f"{why}: {self._inflight} cuda batches still in flight"
                raise TransportError(message)

    # ---- lifetime and reporting ---------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        with self._cond:
            paths = dict(self._paths)
        return {
            **super().describe(),
            "copy_calls": self.calls,
            # The runtime whose batch call moves the pieces, None where one call each does.
            "batch_runtime": None if self._copy.batch is None else self._copy.batch.version,
            "gather": self.gather,
            "gather_below_bytes": int(self.options.gather_below_bytes),
            "gather_chunk_bytes": int(self.options.gather_chunk_bytes),
            "staging": self.staging,
            "tier_slots": "whole" if self.whole_slots else "mirror",
            "staging_buffers": self.options.staging_buffers,
            "staging_buffer_bytes": int(self.options.staging_buffer_bytes),
            "staging_device_bytes": {
                f"cuda:{i}": r.nbytes for i, r in sorted(self._copy.rings.items())
            },
            "staging_index_bytes": {
                f"cuda:{i}": r.index.nbytes for i, r in sorted(self._copy.rings.items())
            },
            "staging_warm_s": {
                f"cuda:{i}": round(s, 6) for i, s in sorted(self._copy.warmed.items())
            },
            "devices": [f"cuda:{i}" for i in sorted(self._streams)],
            "paths": paths,
            "registrations": list(self._history),
        }

    def close(self) -> None:
        """Refuse new batches, wait for every event, stop the completion thread; idempotent.

        Registrations stay until :meth:`detach_region` (the pipeline detaches each region after
        this returns, then unmaps it).
        """
        with self._cond:
            if self._closed:
                return
            self._closed = True
        self._drain("close")
        for stream in self._streams.values():
            stream.synchronize()
        self._copy.close()  # scatter streams too; the staging buffers go back to the allocator
        self._sides.clear()
        if self._thread is not None:
            self._done.put(None)
            self._thread.join()
            self._thread = None
