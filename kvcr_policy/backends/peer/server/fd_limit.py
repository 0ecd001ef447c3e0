"""The descriptors ``serve`` may hold: its soft limit raised to the hard one, and a configuration
whose session caps cannot fit refused before anything starts.

A client session holds about :data:`PER_SESSION` descriptors on the server (its TCP socket,
UCX endpoint sockets and event descriptors, a pidfd, shared-memory segments of a local one;
measured: 11 under ``tls = "tcp"``, rounded up). Every tenant may hold
``security.tenant_max_sessions`` of them at once, so a server with ``T`` tenants needs
``T * tenant_max_sessions * PER_SESSION`` descriptors, plus :data:`RESERVE` of its own
(listeners, the UCX worker, the metrics endpoint's connections, log files, the tier's
handles). Two tenants at the default cap of 64 need 1,600: more than the common soft limit of
1,024, which nothing raised, so a busy server failed logins with ``EMFILE``.
"""

from __future__ import annotations

import resource

from kvcr_policy.errors import ConfigError, ConfigIssue

__all__ = ["PER_SESSION", "RESERVE", "fit_sessions", "raise_soft_limit"]

#: Descriptors one client session holds on the server (rounded up from 11 measured).
PER_SESSION = 12
#: Descriptors the server holds besides its sessions.
RESERVE = 128

_SETTING = "security.tenant_max_sessions"


def raise_soft_limit() -> tuple[int, int]:
    """Raise this process's soft ``RLIMIT_NOFILE`` to its hard limit; the (soft, hard) after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard and (hard == resource.RLIM_INFINITY or soft < hard):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):  # pragma: no cover - a hard limit past the kernel's
            pass
    return soft, hard


def fit_sessions(tenants: int, cap: int, origin: str, limit: int) -> None:
    """Refuse ``tenants`` tenants of at most ``cap`` sessions each (``cap`` from ``origin``)
    when their descriptors cannot fit ``limit`` (the soft limit after
    :func:`raise_soft_limit`)."""
    if limit == resource.RLIM_INFINITY:
        return
    need = tenants * cap * PER_SESSION + RESERVE
    if need <= limit:
        return
    fits = max((limit - RESERVE) // (tenants * PER_SESSION), 0)
    plural = "s" if tenants != 1 else ""
    fix = (
        f"set {_SETTING} to at most {fits} (--set {_SETTING}={fits})"
        if fits
        else "remove tenants from security.tenants_dir"
    )
    message = (
        f"{tenants} tenant{plural} x {cap} sessions x {PER_SESSION} descriptors per session "
        f"+ {RESERVE} of the server's own = {need} descriptors; expected at most the "
        f"descriptor limit of this process, got {limit} (RLIMIT_NOFILE, soft raised to hard); "
        f"{fix}, or raise the hard limit (ulimit -Hn, systemd LimitNOFILE=, docker --ulimit "
        f"nofile=)"
    )
    raise ConfigError([ConfigIssue(_SETTING, origin, message)], title="serve cannot hold them")
