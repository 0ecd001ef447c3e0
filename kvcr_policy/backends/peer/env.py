"""UCX environment knobs: what the config asks for, applied only where the user has not spoken.

UCX reads ``UCX_*`` variables when a context is created, and ucxx sets a few of its own
defaults when it is imported (``UCX_RNDV_THRESH=8192``, ``UCX_RNDV_FRAG_MEM_TYPE=cuda``, ...),
each only if unset. So the knobs are applied before ucxx is imported, a variable the user
already exported always wins, and :func:`apply_env` returns every value in force with its
source, for ``describe()`` and the benchmark.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

from .options import UcxOptions

__all__ = [
    "EnvReport",
    "apply_env",
    "cuda_present",
    "desired_env",
    "progress_mode",
    "same_host_tls",
]

# ucxx/__init__.py (0.52) sets these when it is imported, each only if unset.
UCXX_IMPORT_DEFAULTS = {
    "UCX_MEMTYPE_CACHE": "n",
    "UCX_RNDV_THRESH": "8192",
    "UCX_RNDV_FRAG_MEM_TYPE": "cuda",
    "UCX_MAX_RNDV_RAILS": "1",
}
PROGRESS_ENV = "UCXPY_PROGRESS_MODE"

_lock = threading.Lock()
_applied: dict[str, str] = {}  # variables this process set, so later reports can say so


def cuda_present() -> bool:
    """Whether an NVIDIA device node exists (no CUDA library is loaded to find out)."""
    return os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/nvidia0")


def desired_env(options: UcxOptions) -> dict[str, str]:
    """The UCX variables ``options`` ask for (before looking at the environment)."""
    env: dict[str, str] = {}
    if options.rndv_thresh is not None:
        env["UCX_RNDV_THRESH"] = str(int(options.rndv_thresh))
    if options.tcp_seg_size is not None:
        env["UCX_TCP_TX_SEG_SIZE"] = str(int(options.tcp_seg_size))
        env["UCX_TCP_RX_SEG_SIZE"] = str(int(options.tcp_seg_size))
    if options.net_devices is not None:
        env["UCX_NET_DEVICES"] = options.net_devices
    frag = options.rndv_frag_mem_type
    if frag == "auto":
        frag = "cuda" if cuda_present() else "host"
    env["UCX_RNDV_FRAG_MEM_TYPE"] = frag
    if options.tls == "tcp":
        # Only tcp (and self, for a process talking to itself) in this process's worker address,
        # so no peer can pick shared memory with it.
        env["UCX_TLS"] = "tcp,self"
    elif not options.cma:
        # CMA (process_vm_readv) fails with ESRCH when the peer dies mid-transfer, and on an
        # endpoint without error handling UCX turns that into abort() (cma_ep.c, measured:
        # about 1 kill -9 in 7). posix segments stay mapped when the peer dies. Measured for a
        # 1 GiB restore: self,posix,tcp 10.5-11.5 GB/s; ^cma 4.6-7.5 and self,sysv,posix,tcp
        # 4.5 (UCX then spreads rendezvous over slower lanes). RDMA fabrics: set UCX_TLS
        # (a user's value always wins) or transport.options.env.
        env["UCX_TLS"] = "self,posix,tcp"
    # ucxx sets UCX_MEMTYPE_CACHE, which this UCX no longer knows, and UCX warns about it once
    # per process on stderr; the warning is noise for users of this transport.
    env["UCX_WARN_UNUSED_ENV_VARS"] = "n"
    env.update(options.env)
    return env


# UCX transports that work between two processes of one host and connect to an interface
# (no per-endpoint wire-up of their own); ``sm`` and ``shm`` are UCX's names for the group.
_SAME_HOST = ("self", "sm", "shm", "posix", "sysv", "cma", "knem", "xpmem")


def same_host_tls(tls: str | None) -> str | None:
    """The UCX_TLS of a same-host session's worker, from the process's ``tls`` in force.

    A worker that also offers tcp gives its endpoint to a same-host peer a tcp lane beside the
    shared-memory one, and tcp lanes are wired up by messages. UCX handles such a message
    (``ucp_wireup_process_request``) by choosing the endpoint's lanes again from the sender's
    address; when the sender died after sending it, its shared-memory segment can no longer be
    opened (``/proc/<pid>/fd/<n>`` is gone), the choice comes out tcp-only, and UCX 1.21
    aborts the process ("endpoint reconfiguration not supported yet", wireup.c): a client
    killed while connecting took ``serve`` down. With shared-memory transports only, that
    choice finds no lane and UCX fails the one endpoint instead. None: ``tls`` offers no
    shared-memory transport (the process's own worker settings are used).
    """
    if tls is None or tls.strip() in ("", "all") or tls.strip().startswith("^"):
        return "self,sm"
    names = [name.strip() for name in tls.split(",") if name.strip()]
    kept = [name for name in names if name in _SAME_HOST]
    if not any(name != "self" for name in kept):
        return None
    return ",".join(kept)


@dataclass(frozen=True, slots=True)
class EnvReport:
    """Every knob in force: ``{name: (value, source)}``; sources: ``config``, ``user env``,
    ``ucxx default``; ``ignored`` lists config values a user variable overrode."""

    values: Mapping[str, tuple[str, str]]
    ignored: Mapping[str, str]
    progress_mode: tuple[str, str]

    def to_dict(self) -> dict[str, Any]:
        return {
            "env": {name: {"value": v, "source": s} for name, (v, s) in self.values.items()},
            "ignored_config": dict(self.ignored),
            "progress_mode": {"value": self.progress_mode[0], "source": self.progress_mode[1]},
        }


def progress_mode(options: UcxOptions, environ: Mapping[str, str] | None = None) -> tuple[str, str]:
    """The progress mode in force and its source: env ``UCXPY_PROGRESS_MODE`` wins."""
    environ = os.environ if environ is None else environ
    mode = environ.get(PROGRESS_ENV)
    if mode:
        if mode not in ("blocking", "polling", "thread"):
            message = (
                f"env {PROGRESS_ENV}={mode!r}: this transport runs 'blocking', 'polling' or "
                f"'thread' progress; unset it or pick one of those"
            )
            raise ValueError(message)
        return mode, f"env {PROGRESS_ENV}"
    return options.progress_mode, "config transport.options.progress_mode"


def apply_env(options: UcxOptions, environ: MutableMapping[str, str] | None = None) -> EnvReport:
    """Set each wanted variable that is unset; report all of them and ucxx's own defaults."""
    environ = os.environ if environ is None else environ
    wanted = desired_env(options)
    values: dict[str, tuple[str, str]] = {}
    ignored: dict[str, str] = {}
    ucxx_loaded = "ucxx" in sys.modules
    with _lock:
        for name, value in wanted.items():
            current = environ.get(name)
            if current is None:
                environ[name] = value
                _applied[name] = value
                values[name] = (value, "config")
            elif _applied.get(name) == current:
                values[name] = (current, "config")  # set by an earlier transport here
                if current != value:
                    ignored[name] = value
            else:
                source = "user env"
                if ucxx_loaded and UCXX_IMPORT_DEFAULTS.get(name) == current:
                    source = "ucxx default (ucxx was imported first)"
                values[name] = (current, source)
                if current != value:
                    ignored[name] = value
        for name, value in UCXX_IMPORT_DEFAULTS.items():
            if name in values:
                continue
            if name in environ:
                values[name] = (environ[name], "user env")
            else:
                values[name] = (value, "ucxx default")
    return EnvReport(values, ignored, progress_mode(options, environ))
