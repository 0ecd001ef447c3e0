"""Process defaults of the KVCR runner: UCX variables, the listen port, NIXL's progress thread.

NIXL's UCX reads ``UCX_*`` variables when an agent starts, and those variables belong to the
whole process. So each default is applied only where the variable is unset (a value the user
exported always wins), before the first runner of a pool starts, and every value in force is
reported with its source for ``describe()``:

- ``UCX_NET_DEVICES=lo`` (``ucx_net_devices``): a local tier moves its bytes over loopback;
  without it UCX's tcp listens on every interface.
- ``UCX_TLS`` (``ucx_tls``): whatever it is, it must keep tcp, which NIXL's UCX backend needs
  for peer error handling (without it the backend fails with ``NIXL_ERR_BACKEND``); a user's
  value without tcp is refused here with the fix, instead of an opaque start failure.
- The listen port KVCR requires: the configured one, or a free one chosen per pool.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

from kvcr_policy.plugin_api import ConfigError, ConfigIssue

from .options import KvcrOptions, tls_keeps_tcp

__all__ = ["ProcessReport", "apply_process_defaults", "free_port", "port_free"]

_lock = threading.Lock()
_applied: dict[str, str] = {}  # variables a kvcr backend of this process set, and to what


@dataclass(frozen=True, slots=True)
class ProcessReport:
    """Every process default in force: ``{name: (value, source)}``; ``ignored`` lists option
    values a variable already set in the environment overrode."""

    values: Mapping[str, tuple[str | None, str]]
    ignored: Mapping[str, str]

    def to_dict(self) -> dict[str, Any]:
        return {
            "env": {n: {"value": v, "source": s} for n, (v, s) in self.values.items()},
            "ignored_options": dict(self.ignored),
        }


def _option_origin(origins: Mapping[str, str], option: str) -> str:
    path = f"backend.options.{option}"
    return f"{path} (from {origins.get(path, 'default')})"


def _wanted(options: KvcrOptions, origins: Mapping[str, str]) -> dict[str, tuple[str, str]]:
    wanted: dict[str, tuple[str, str]] = {}
    if options.ucx_net_devices is not None:
        origin = _option_origin(origins, "ucx_net_devices")
        wanted["UCX_NET_DEVICES"] = (options.ucx_net_devices, origin)
    if options.ucx_tls is not None:
        wanted["UCX_TLS"] = (options.ucx_tls, _option_origin(origins, "ucx_tls"))
    for name, value in options.env.items():
        wanted[name] = (value, _option_origin(origins, f"env.{name}"))
    return wanted


def apply_process_defaults(
    options: KvcrOptions,
    origins: Mapping[str, str],
    environ: MutableMapping[str, str] | None = None,
) -> ProcessReport:
    """Set each wanted variable that is unset; refuse a ``UCX_TLS`` without tcp; report."""
    environ = os.environ if environ is None else environ
    values: dict[str, tuple[str | None, str]] = {}
    ignored: dict[str, str] = {}
    with _lock:
        for name, (value, origin) in _wanted(options, origins).items():
            current = environ.get(name)
            if current is None:
                environ[name] = value
                _applied[name] = value
                values[name] = (value, origin)
                continue
            if _applied.get(name) == current:
                values[name] = (current, "an earlier kvcr backend of this process")
            else:
                values[name] = (current, f"environment {name} (set before the backend opened)")
            if current != value:
                ignored[name] = f"{value} ({origin})"
        tls = environ.get("UCX_TLS")
        if tls is not None and not tls_keeps_tcp(tls):
            issue = ConfigIssue(
                "UCX_TLS",
                f"env UCX_TLS={tls!r}",
                "NIXL's UCX backend needs the tcp transport for peer error handling, and this "
                "value leaves it out (the KVCR runner would fail with NIXL_ERR_BACKEND); add "
                "tcp to UCX_TLS or unset it",
            )
            raise ConfigError([issue], title="the kvcr backend cannot start in this environment")
        values.setdefault("UCX_TLS", (tls, "environment" if tls is not None else "UCX default"))
        if "UCX_NET_DEVICES" not in values:
            devices = environ.get("UCX_NET_DEVICES")
            source = "environment" if devices is not None else "UCX default (every interface)"
            values["UCX_NET_DEVICES"] = (devices, source)
    return ProcessReport(values, ignored)


def free_port() -> int:
    """A TCP port free on every interface right now (NIXL's listener binds 0.0.0.0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("0.0.0.0", 0))
        return int(probe.getsockname()[1])


def port_free(port: int) -> bool:
    """Whether ``port`` can be bound on every interface right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("0.0.0.0", port))
        except OSError:
            return False
        return True
