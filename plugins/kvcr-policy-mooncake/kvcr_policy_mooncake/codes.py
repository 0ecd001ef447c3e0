"""Mooncake Store result codes, and what each means for a page.

The Python binding returns plain integers: per key, bytes read (a get), 0 (a put or remove),
1/0 (exists), or a negative ``ErrorCode`` from ``mooncake-store/include/types.h``. Only the
codes below are told apart; any other negative code is a failed transfer.
"""

from __future__ import annotations

from enum import IntEnum

__all__ = ["STORED", "Code", "describe", "is_master_down"]


class Code(IntEnum):
    """The ``ErrorCode`` values (mooncake-store/include/types.h) this backend acts on."""

    INTERNAL_ERROR = -1
    NO_AVAILABLE_HANDLE = -200  # no segment has room (after eviction): the store is full
    INVALID_PARAMS = -600
    REPLICA_IS_NOT_READY = -703  # a put still in progress: not present yet
    OBJECT_NOT_FOUND = -704
    OBJECT_ALREADY_EXISTS = -705  # a put of a present key: the first value stays
    OBJECT_HAS_LEASE = -706  # a remove during the lease every get and exists grants
    LEASE_EXPIRED = -707
    TRANSFER_FAIL = -800  # the segment holding the page did not answer (its client died)
    RPC_FAIL = -900  # the master did not answer
    RPC_TIMEOUT = -901
    TENANT_QUOTA_EXCEEDED = -1700  # a master that enforces tenants: the tenant's quota is full
    TENANT_NOT_REGISTERED = -1701  # ... and its policy does not name this client's tenant


#: Codes after which the master is presumed down: the health state opens.
MASTER_DOWN = frozenset({Code.RPC_FAIL, Code.RPC_TIMEOUT})
#: Put codes of a page now present: stored, or present already (the first value stays).
STORED = frozenset({0, Code.OBJECT_ALREADY_EXISTS})


def describe(code: int) -> str:
    """``-704 OBJECT_NOT_FOUND`` for a known code, ``-123`` otherwise."""
    try:
        return f"{code} {Code(code).name}"
    except ValueError:
        return str(code)


def is_master_down(code: int) -> bool:
    return code in MASTER_DOWN
