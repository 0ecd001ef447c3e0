"""The cuda transport: GPU pools, a DMA-registered (pinned) tier, copies on a dedicated stream.

Pageable host memory moves to a GPU at about a tenth of the PCIe rate, so each tier region is
registered with ``cudaHostRegister`` (portable, mapped) when its pool registers, and unregistered
only after every copy that could touch it has completed. A batch is enqueued on the transport's
own stream of the pool's device, one event is recorded after it, and its future completes when
that event has (a completion thread waits on events in submission order, with the GIL
released). Three ways to move a batch, chosen per batch and counted in :meth:`describe`:

- ``copies``: one asynchronous copy per descriptor (a copy engine at the PCIe rate once
  descriptors are large, i.e. coalesced);
- ``gather``: many small descriptors (scattered slots, or no coalescing) become a few index
  kernels that read or write the pinned tier through its device mapping
  (:mod:`.cuda_gather`), since one copy call per 128 KiB fragment reaches
  only a sixth of the PCIe rate;
- ``staging``: many small descriptors whose host side comes in long contiguous runs
  (scattered whole tier slots) cross PCIe run by run into a bounded ring of device buffers,
  and an index kernel on a second stream scatters each buffer into the pool, overlapped
  (:mod:`.cuda_staging`); stores gather on the GPU, then copy whole runs out. A batch that
  finds the GPU idle is planned in growing chunks, its first copy enqueued before the rest is
  planned (:mod:`.cuda_chunks`); a staged restore completes on the scatter stream.

torch is imported when a transport is built, never at import: the options model and the
registration work on machines without CUDA, where building the transport raises
:class:`CudaUnavailableError` ("no CUDA device visible").
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from kvcr_policy.errors import ClosedError, CudaUnavailableError, TransportError
from kvcr_policy.memory.cuda import NO_CUDA, require_cuda
from kvcr_policy.memory.locality import DeviceLocality, locate, pci_address
from kvcr_policy.schema import PolicyConfig

from .base import CopyBatch, Endpoint, Transport, check_bounds
from .cuda_chunks import chunk_bounds, host_runs, overlapping
from .cuda_gather import choose_kernel, plan_rows, run_rows
from .cuda_options import CudaOptions, resolved_modes
from .cuda_staging import StagingRing, host_spans, plan_staging, stage

__all__ = [
    "NO_CUDA",
    "CudaOptions",
    "CudaTransport",
    "CudaUnavailableError",
    "cuda_locality",
    "require_cuda",
]

log = logging.getLogger("kvcr_policy.backends.dram.transports.cuda")

# cudaHostRegisterPortable | cudaHostRegisterMapped (cuda_runtime_api.h): usable from every
# device, and mapped into the device address space so kernels can read it (the gather path).
_REGISTER_FLAGS = 0x01 | 0x02


class _Interface:
    """Raw memory as ``__array_interface__`` / ``__cuda_array_interface__`` (no buffer export).

    Views made this way hold no export of the tier's mmap, so the region can still unmap once
    the views are dropped (memory.region.Region.close refuses while an export is alive).
    """

    def __init__(self, address: int, nbytes: int) -> None:
        spec = {"shape": (nbytes,), "typestr": "|u1", "data": (address, False), "version": 3}
        self.__array_interface__ = spec
        self.__cuda_array_interface__ = {**spec, "strides": None}


@dataclass
class _Registration:
    """One tier region registered for DMA, with its host and device views."""

    address: int
    nbytes: int
    device: int
    seconds: float
    pointer: str
    host: Any = field(repr=False)  # uint8 CPU tensor over the region
    mapped: Any = field(repr=False)  # uint8 CUDA tensor over the same bytes (device mapping)

    def report(self) -> dict[str, Any]:
        return {
            "bytes": self.nbytes,
            "device": f"cuda:{self.device}",
            "seconds": round(self.seconds, 6),
            "gigabytes_per_s": round(self.nbytes / self.seconds / 1e9, 3) if self.seconds else None,
            "flags": "portable|mapped",
            "device_pointer": self.pointer,
        }


class CudaTransport(Transport):
    """Moves pages between GPU pools and their pinned tier regions on one stream per device."""

    name = "cuda"
    capabilities = frozenset({"coalesce", "split"})
    devices = frozenset({"cuda"})

    def __init__(self, config: PolicyConfig, options: CudaOptions) -> None:
        super().__init__(workers=1)
        self._torch = torch = require_cuda()
        self.options = options
        # The default follows the coalescing control, so the default profile issues one copy
        # per fragment as upstream does, and a profile that coalesces also gathers.
        self.gather, self.staging, self.whole_slots = resolved_modes(
            options, config.coalescing.strategy
        )
        self._rings: dict[int, StagingRing] = {}
        self._aux: dict[int, Any] = {}
        self._aux_behind: set[int] = set()  # devices whose aux stream holds unwaited scatters
        self.timeout = config.transport.op_timeout_s
        self._cudart = torch.cuda.cudart()
        self._regions: dict[int, _Registration] = {}
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

    # ---- regions ------------------------------------------------------------------------

    def attach_region(self, region: Endpoint, pool: Endpoint) -> None:
        """Register the tier region for DMA on the pool's device; the time taken is reported."""
        torch = self._torch
        device = self._device_index(pool)
        with torch.cuda.device(device):
            start = time.perf_counter()
            err = self._cudart.cudaHostRegister(region.address, region.nbytes, _REGISTER_FLAGS)
            seconds = time.perf_counter() - start
            if int(err) != 0:
                message = (
                    f"cudaHostRegister of the {region.nbytes}-byte tier region failed: "
                    f"{self._cudart.cudaGetErrorString(err)}; lower placement.capacity_bytes or "
                    "raise the locked-memory limit (ulimit -l)"
                )
                raise TransportError(message)
            pointer, mapped_address = self._device_pointer(region.address)
            interface = _Interface(region.address, region.nbytes)
            host = torch.from_numpy(np.asarray(interface))
            mapped = torch.as_tensor(
                _Interface(mapped_address, region.nbytes), device=f"cuda:{device}"
            )
        registration = _Registration(
            region.address, region.nbytes, device, seconds, pointer, host, mapped
        )
        self._regions[region.address] = registration
        self._history.append(registration.report())
        if self.staging != "never":  # the ring's memory is taken here, not in the first copy
            self._ring(device)
        log.info(
            "tier registered for DMA: %d bytes on cuda:%d in %.3f s",
            region.nbytes,
            device,
            seconds,
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
        registration.host = registration.mapped = None
        status = self._cudart.cudaHostUnregister(region.address)
        if int(status) != 0:
            log.warning(
                "cudaHostUnregister of the tier region failed: %s",
                self._cudart.cudaGetErrorString(status),
            )

    def pinned(self, region: Endpoint) -> tuple[int, float]:
        registration = self._regions.get(region.address)
        return (0, 0.0) if registration is None else (registration.nbytes, registration.seconds)

    def locate(self, endpoint: Endpoint) -> DeviceLocality | None:
        """The GPU of a CUDA endpoint, located by the PCI address torch reports for it."""
        if not endpoint.device.startswith("cuda"):
            return None
        index = self._device_index(endpoint)
        return cuda_locality(self._torch, index)

    def _device_pointer(self, address: int) -> tuple[str, int]:
        """Where kernels see a registered address: cudaHostGetDevicePointer when cuda-python
        is installed, else the host address itself (unified addressing, 64-bit Linux)."""
        try:
            from cuda.bindings import runtime
        except ImportError:
            return "unified", address
        err, pointer = runtime.cudaHostGetDevicePointer(address, 0)
        if int(err) != 0:
            message = f"cudaHostGetDevicePointer failed for a registered tier region: {err}"
            raise TransportError(message)
        return "cudaHostGetDevicePointer", int(pointer)

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
            path = self._path(d)
            staged = self._staged(d, src, dst, src_device, dst_device, device, stream)
            if staged is not None:
                path, keep, done = staged
            else:
                path, keep = self._direct(d, src, dst, device, stream, path)
            event = torch.cuda.Event()
            event.record(done)
        with self._cond:
            self._paths[f"{path}.batches"] += 1
            self._paths[f"{path}.descriptors"] += len(d)
            self._paths[f"{path}.bytes"] += d.nbytes
        return event, keep

    def _direct(
        self, d: Any, src: dict[str, Any], dst: dict[str, Any], device: int, stream: Any, path: str
    ) -> tuple[str, list[Any]]:
        """Copies (or gather kernels) on ``stream``, after a staged restore's scatters."""
        torch = self._torch
        if device in self._aux_behind:
            stream.wait_stream(self._aux[device])
            self._aux_behind.discard(device)
        keep: list[Any] = []
        if path == "gather":
            plan = plan_rows(
                d,
                src_base=src["mapped"].data_ptr(),
                dst_base=dst["mapped"].data_ptr(),
                max_unit=int(self.options.gather_chunk_bytes),
            )
            if plan is not None:
                kind = choose_kernel(plan)
                keep = run_rows(
                    torch,
                    src["mapped"],
                    dst["mapped"],
                    plan,
                    kind,
                    device=torch.device("cuda", device),
                    chunk_bytes=int(self.options.gather_chunk_bytes),
                )
                return f"gather:{kind}", keep
            return path, keep
        _copies(src["copy"], dst["copy"], d)
        return path, keep

    def _staged(
        self,
        d: Any,
        src: dict[str, Any],
        dst: dict[str, Any],
        src_device: int | None,
        dst_device: int | None,
        device: int,
        stream: Any,
    ) -> tuple[str, list[Any], Any] | None:
        """Move ``d`` through the staging ring when the policy says so: its path, what to keep
        alive, and the stream that finishes it; None otherwise.

        A batch that finds ``stream`` idle is planned in growing chunks, the first copy
        enqueued before the rest is planned (:func:`.cuda_chunks.chunk_bounds`).
        """
        if self.staging == "never" or (src_device is None) == (dst_device is None):
            return None  # off, or not between a GPU and the host
        restore = src_device is None
        options = self.options
        choose = partial(
            stage,
            self.staging,
            descriptors=len(d),
            nbytes=d.nbytes,
            below_bytes=int(options.gather_below_bytes),
            min_descriptors=options.gather_min_descriptors,
            min_span_bytes=int(options.staging_min_span_bytes),
        )
        if not choose(spans=0):  # not fragmented: no need to plan
            return None
        host, pool = (d.src, d.dst) if restore else (d.dst, d.src)
        sorted_ = False
        if not choose(spans=host_runs(host, d.length)):
            # Runs in the order given fall short: host order may join them (one sort).
            if not choose(spans=host_spans(host, d.length)[0]):
                return None
            if overlapping(pool if restore else host, d.length):
                return None  # reordered writes to one byte would change the result
            d = d.take(np.argsort(host, kind="stable"))
            host, pool = (d.src, d.dst) if restore else (d.dst, d.src)
            sorted_ = True
        buffer_bytes = int(options.staging_buffer_bytes)
        ring, aux = self._ring(device)
        first = 2 * buffer_bytes if stream.query() else None  # idle: start copying early
        write = "device" if restore else "host"
        keep: list[Any] = []
        if not restore:
            aux.wait_stream(stream)  # gathers read the pool after what was enqueued before
        chunks = 0
        # Chunks run in the order given, each after the one before (scatters in order on aux,
        # host writes in order on stream), so only writes within a chunk need checking.
        for lo, hi in chunk_bounds(d.length, first):
            plan = plan_staging(
                host[lo:hi],
                pool[lo:hi],
                d.length[lo:hi],
                buffer_bytes=buffer_bytes,
                write=write,
                checked=sorted_,
            )
            if plan is None:  # moves nothing, or writes one byte twice: copies, in order
                self._direct(d.take(np.arange(lo, hi)), src, dst, device, stream, "copies")
                if not restore:
                    aux.wait_stream(stream)
                continue
            chunks += 1
            if restore:
                keep += ring.restore(plan, src["copy"], dst["copy"], stream, aux)
                self._aux_behind.add(device)
            else:
                keep += ring.store(plan, src["copy"], dst["copy"], stream, aux)
        with self._cond:
            self._paths[f"staging:{'restore' if restore else 'store'}.chunks"] += chunks
        if not chunks:  # every chunk took copies
            return "copies", keep, stream
        if restore:  # the scatters on aux finish it; later batches on stream wait for them
            return "staging:restore", keep, aux if device in self._aux_behind else stream
        self._aux_behind.discard(device)  # stream waited for every gather
        return "staging:store", keep, stream

    def _ring(self, device: int) -> tuple[StagingRing, Any]:
        """The staging ring of ``device`` and its scatter stream, made on first need."""
        ring = self._rings.get(device)
        if ring is None:
            options = self.options
            ring = self._rings[device] = StagingRing(
                self._torch, device, int(options.staging_buffer_bytes), options.staging_buffers
            )
            self._aux[device] = self._torch.cuda.Stream(device=device)
        return ring, self._aux[device]

    def _path(self, d: Any) -> str:
        mode = self.gather
        if mode == "never" or len(d) == 0:
            return "copies"
        if mode == "always":
            return "gather"
        small = d.nbytes < len(d) * int(self.options.gather_below_bytes)
        return "gather" if small and len(d) >= self.options.gather_min_descriptors else "copies"

    def _side(self, endpoint: Endpoint) -> tuple[dict[str, Any], int | None]:
        """Views of one endpoint: ``copy`` (for copy_) and ``mapped`` (a CUDA tensor), device."""
        torch = self._torch
        if endpoint.device.startswith("cuda"):
            device = self._device_index(endpoint)
            buffer = endpoint.buffer
            if isinstance(buffer, torch.Tensor) and buffer.data_ptr() == endpoint.address:
                flat = buffer.detach().reshape(-1).view(torch.uint8)[: endpoint.nbytes]
            else:
                flat = torch.as_tensor(
                    _Interface(endpoint.address, endpoint.nbytes), device=f"cuda:{device}"
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
            "gather": self.gather,
            "gather_below_bytes": int(self.options.gather_below_bytes),
            "gather_chunk_bytes": int(self.options.gather_chunk_bytes),
            "staging": self.staging,
            "tier_slots": "whole" if self.whole_slots else "mirror",
            "staging_buffers": self.options.staging_buffers,
            "staging_buffer_bytes": int(self.options.staging_buffer_bytes),
            "staging_device_bytes": {f"cuda:{i}": r.nbytes for i, r in sorted(self._rings.items())},
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
        for stream in [*self._streams.values(), *self._aux.values()]:
            stream.synchronize()
        self._rings.clear()  # the staging buffers go back to the allocator
        if self._thread is not None:
            self._done.put(None)
            self._thread.join()
            self._thread = None


def cuda_locality(torch: Any, index: int) -> DeviceLocality:
    """GPU ``index`` and its NUMA node: its PCI address from torch's device properties (the
    same fields ``torch.numa.binding`` reads), its node from sysfs."""
    props = torch.cuda.get_device_properties(index)
    try:  # torch builds without these fields (older ones) leave the GPU unlocated
        ids = [int(getattr(props, f"pci_{name}_id")) for name in ("domain", "bus", "device")]
    except AttributeError:
        return locate(f"cuda:{index}", None)
    return locate(f"cuda:{index}", pci_address(*ids))


def _copies(src: Any, dst: Any, d: Any) -> None:
    """One asynchronous copy per descriptor on the current stream (pinned: truly async)."""
    for s, t, n in zip(d.src.tolist(), d.dst.tolist(), d.length.tolist(), strict=True):
        dst[t : t + n].copy_(src[s : s + n], non_blocking=True)
