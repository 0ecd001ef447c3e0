"""What the state machines share: how many sequences each runs, and the tally of what they saw.

Every machine counts its sequences (one per machine instance Hypothesis builds) and compares
bytes through :func:`same_bytes`, which counts a mismatch before it fails the step; the
session-finish hook in ``tests/conftest.py`` prints the totals, so a CI log shows how much of
the production path ran under stateful testing and that no page reported present was wrong.

Import this module as ``tests.support.stateful`` everywhere (one module object, one tally).
"""

from __future__ import annotations

import zlib
from collections import Counter

import numpy as np
from hypothesis import settings

from kvcr_policy.geometry import PoolGeometry
from tests.support.pools import page_slice

__all__ = [
    "MISMATCHES",
    "SEQUENCES",
    "content",
    "count_sequence",
    "machine_settings",
    "same_bytes",
]

#: Sequences run per machine name, in this process.
SEQUENCES: Counter[str] = Counter()
#: Pages whose bytes differed from the model's, per machine name (a failed step each).
MISMATCHES: Counter[str] = Counter()

# Under the quick ``dev`` profile every machine runs this share of its ``ci`` sequences.
_SHARE = {"dev": 0.1}


def count_sequence(machine: str) -> None:
    """Count one sequence of ``machine`` (call it from the machine's ``__init__``)."""
    SEQUENCES[machine] += 1


def same_bytes(machine: str, got: object, want: object, what: str) -> None:
    """Assert that ``got`` and ``want`` hold the same bytes; a difference is tallied first."""
    a = got if isinstance(got, bytes) else np.ascontiguousarray(got).tobytes()
    b = want if isinstance(want, bytes) else np.ascontiguousarray(want).tobytes()
    if a != b:
        MISMATCHES[machine] += 1
        first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
        raise AssertionError(
            f"{machine}: {what}: {len(a)} bytes differ from the {len(b)} expected "
            f"(first difference at byte {first})"
        )


def machine_settings(ci_sequences: int, steps: int) -> settings:
    """Settings of a state machine: ``ci_sequences`` sequences of up to ``steps`` steps under
    the ``ci`` profile (a tenth under ``dev``), no deadline (steps start processes, map memory)."""
    share = _SHARE.get(settings.get_current_profile_name(), 1.0)
    return settings(
        max_examples=max(1, round(ci_sequences * share)),
        stateful_step_count=steps,
        deadline=None,
    )


def content(geo: PoolGeometry, key: str, version: int) -> np.ndarray:
    """The bytes a machine stores for ``key`` at ``version``, shaped as one page of the pool."""
    shape = np.zeros(geo.shape, np.uint8)[page_slice(geo, 0)].shape
    rng = np.random.default_rng(zlib.crc32(f"{key}@{version}".encode()))
    return rng.integers(0, 1 << 16, size=shape, dtype=np.uint16).view(np.float16)
