"""The conformance checks: each builds pipelines on the backend under test through its factory,
moves the suite's pool through the real pipeline, and raises :class:`ConformanceError` naming
what the backend did wrong."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numpy as np

from ..errors import (
    ArgumentError,
    CapacityError,
    ClosedError,
    ConformanceError,
    IndicesError,
    PoolError,
    UsageError,
)
from ..pipeline import Pipeline
from .faults import Fault, FaultyTier
from .pools import SLOTS, fresh_keys, geometry, pages_of, pool, tokens

__all__ = ["CHECKS", "Factory"]

#: ``factory(overrides)``: a new pipeline on the backend under test, with these configuration
#: values (``{"batching.read_batch_pages": 2}``, ...) over the backend's own; its tier holds at
#: least :data:`~.pools.SLOTS` pages of the suite's pool.
Factory = Callable[[Mapping[str, Any]], Pipeline]


def expect(ok: bool, what: str) -> None:
    if not ok:
        raise ConformanceError(what)


@contextmanager
def stored(factory: Factory, n: int, **overrides: Any) -> Iterator[tuple[Pipeline, Any, list[str]]]:
    """A pipeline whose pool (a name of its own) stored ``n`` fresh keys from pages 0..n-1:
    the pipeline, the pool's page view and the keys; closed after."""
    geo = geometry()
    buffer = pool(geo)
    with factory(overrides) as pipeline:
        pipeline.register_pool(f"kv-{uuid.uuid4().hex[:8]}", geo, buffer)
        keys = fresh_keys(n)
        got = pipeline.set(keys, tokens(range(n)))
        expect(got == [True] * n, f"a set of {n} new keys into an empty tier stored {got}")
        yield pipeline, pages_of(buffer, geo), keys


def restored(pipeline: Pipeline, view: Any, keys: list[str], into: int, **kw: Any) -> list[bool]:
    """``get`` of ``keys`` into pages ``into``.. (zeroed first)."""
    view[:, into : into + len(keys)] = 0
    return pipeline.get(keys, tokens(range(into, into + len(keys))), **kw)


def check_byte_exact(factory: Factory) -> None:
    """What a set stored, a get restores byte for byte, in one batch or in many."""
    for overrides in ({}, {"batching.read_batch_pages": 2, "batching.window_batches": 2}):
        with stored(factory, 12, **overrides) as (pipeline, view, keys):
            expected = view[:, :12].copy()
            ready: list[int] = []
            got = restored(pipeline, view, keys, 20, on_ready=ready.append)
            expect(got == [True] * 12, f"{overrides or 'defaults'}: a get of 12 stored keys: {got}")
            expect(np.array_equal(view[:, 20:32], expected), "restored bytes differ from stored")
            told = f"on_ready told {ready}; its last count must be 12"
            expect(bool(ready) and ready[-1] == 12, told)
            stats = pipeline.stats()
            expect(stats.pages_read == 12 and stats.pages_written == 12, f"counted {stats}")


def check_partial_hits(factory: Factory) -> None:
    """exists and get stop at the first absent key: the leading run, nothing read after it."""
    with stored(factory, 6) as (pipeline, view, keys):
        asked = [*keys[:3], fresh_keys(1)[0], *keys[3:]]
        expect(pipeline.exists(asked) == 3, "exists of 3 present, 1 absent, 3 present: not 3")
        expected = view[:, :3].copy()
        got = restored(pipeline, view, asked, 30)
        expect(got == [True] * 3 + [False] * 4, f"get past an absent key reported {got}")
        expect(np.array_equal(view[:, 30:33], expected), "the leading run's bytes differ")
        expect(not view[:, 33:37].any(), "a page after the first absent key was written")


def check_keys(factory: Factory) -> None:
    """A set of present keys succeeds; a key repeated in one set stores its first page; delete
    and clear forget; the longest key (1024 bytes) is a key like any other."""
    with stored(factory, 4) as (pipeline, view, keys):
        got = pipeline.set(keys, tokens(range(10, 14)))
        expect(got == [True] * 4, f"a set of present keys reported {got}")
        twice = fresh_keys(1)[0]
        got = pipeline.set([twice, keys[0], twice], tokens([5, 6, 7]))
        expect(got == [True] * 3, f"a set naming one key twice reported {got}")
        view[:, 20:22] = 0
        got = pipeline.get([twice, twice], tokens([20, 21]))
        first = np.array_equal(view[:, 20], view[:, 5]) and np.array_equal(view[:, 21], view[:, 5])
        expect(got == [True, True] and first, "a key set twice in one call: not its first page")
        deleted = _delete(pipeline, keys[:2])
        expect(deleted == 2, f"delete of 2 present keys counted {deleted}")
        expect(pipeline.exists(keys) == 0 and pipeline.exists(keys[2:]) == 2, "delete forgot")
        pipeline.clear()
        expect(pipeline.exists(keys[2:]) == 0, "a key outlived clear()")
        longest = "k" * 1024
        expect(pipeline.set([longest], tokens([40])) == [True], "a 1024-byte key was refused")
        expect(pipeline.exists([longest]) == 1, "a 1024-byte key was not found")


def _delete(pipeline: Pipeline, keys: list[str], within_s: float = 30.0) -> int:
    """``delete(keys)``, again until every key is gone (a backend may hold a key a while
    after a get, as Mooncake's leases do), at most ``within_s``."""
    count = pipeline.delete(keys)
    deadline = time.monotonic() + within_s
    while count < len(keys) and time.monotonic() < deadline:
        time.sleep(0.25)
        count += pipeline.delete(keys)
    return count


def check_claims(factory: Factory) -> None:
    """A full tier, a restore in small batches, and at each delivered batch a set of new keys
    that needs evictions: every page the restore reports carries its stored bytes."""
    with stored(
        factory, SLOTS, **{"batching.read_batch_pages": 2, "batching.window_batches": 2}
    ) as (
        pipeline,
        view,
        keys,
    ):
        expected = view[:, :SLOTS].copy()
        intruders = fresh_keys(4 * SLOTS)
        pressure: list[Any] = []

        def on_ready(count: int) -> None:
            batch = intruders[len(pressure) * 4 : len(pressure) * 4 + 4]
            view[:, 40:44] = 0xA5  # bytes that must never reach a page under a claimed key
            try:
                pressure.append(pipeline.set(batch, tokens(range(40, 44))))
            except CapacityError as err:  # every slot claimed: refusing is correct
                pressure.append(err)

        got = restored(pipeline, view, keys, 20, on_ready=on_ready)
        lead = got.index(False) if False in got else len(got)
        expect(bool(pressure), "on_ready was never called")
        expect(got == [True] * lead + [False] * (len(got) - lead), f"not a leading run: {got}")
        expect(lead >= 2, f"the first batch was not delivered before any pressure: {got}")
        same = np.array_equal(view[:, 20 : 20 + lead], expected[:, :lead])
        expect(same, "a page being read was evicted or overwritten by a later set")


def _faulty(pipeline: Pipeline, fault: Fault) -> FaultyTier:
    """Every pool tier of ``pipeline`` wrapped in a :class:`FaultyTier` (the pipeline's own
    table of tiers: the seam is where the suite injects)."""
    pools = pipeline._pools
    (name, (geo, tier)), *_ = pools.items()
    faulty = FaultyTier(tier, fault)
    pools[name] = (geo, faulty)
    return faulty


def check_faults(factory: Factory) -> None:
    """Failed batches, before and after their bytes moved, go to the fallback page by page; a
    set stores and a get restores every page exactly all the same."""
    geo = geometry()
    for fault in ("early", "late"):
        buffer = pool(geo, 3)
        with factory({"batching.read_batch_pages": 3}) as pipeline:
            pipeline.register_pool(f"kv-{uuid.uuid4().hex[:8]}", geo, buffer)
            faulty = _faulty(pipeline, fault)
            keys = fresh_keys(12)
            got = pipeline.set(keys, tokens(range(12)))
            expect(got == [True] * 12, f"{fault} faults: a set reported {got}")
            view = pages_of(buffer, geo)
            expected = view[:, :12].copy()
            got = restored(pipeline, view, keys, 20)
            expect(got == [True] * 12, f"{fault} faults: a get reported {got}")
            expect(np.array_equal(view[:, 20:32], expected), f"{fault} faults: bytes differ")
            expect(faulty.failed > 0, f"{fault} faults: no batch of several pages was submitted")


def check_close(factory: Factory) -> None:
    """close() waits for a running call; every later call raises ClosedError; close twice."""
    with stored(factory, 12, **{"batching.read_batch_pages": 1}) as (pipeline, view, keys):
        started, results = threading.Event(), []

        def restore() -> None:
            results.append(restored(pipeline, view, keys, 20, on_ready=lambda n: started.set()))

        worker = threading.Thread(target=restore)
        worker.start()
        expect(started.wait(60), "a get delivered no page within 60 s")
        pipeline.close()
        worker.join(60)
        expect(results == [[True] * 12], f"close did not wait for the running get: {results}")
        for name, call in (
            ("get", lambda: pipeline.get(keys, tokens(range(20, 32)))),
            ("exists", lambda: pipeline.exists(keys)),
            ("stats", pipeline.stats),
        ):
            try:
                call()
            except ClosedError:
                continue
            raise ConformanceError(f"{name}() after close() did not raise ClosedError")
        pipeline.close()  # idempotent


#: Bad keys, the error each call must raise, and what its message says.
BAD_KEYS: tuple[tuple[Any, type[Exception], str], ...] = (
    ([1, 2], UsageError, "position 0 must be a str, got int"),
    ([None], UsageError, "must be a str, got NoneType"),
    ([b"k"], UsageError, "must be a str, got bytes"),
    ("ab", UsageError, "list or tuple of str, got str"),
    (["x" * 1025], ArgumentError, "1025 bytes in UTF-8; a key has 1 to 1024"),
    ([""], ArgumentError, "0 bytes"),
    (["\ud800"], ArgumentError, "not valid Unicode"),
)


def check_bad_input(factory: Factory) -> None:
    """Bad keys, indices and probe sizes are refused with the pipeline's errors, the same on
    every backend, and the pipeline keeps working."""
    with stored(factory, 1) as (pipeline, view, keys):
        for bad, error, says in BAD_KEYS:
            for call in ("exists", "get", "set", "delete"):
                args = (bad,) if call in ("exists", "delete") else (bad, tokens([20]))
                _refused(getattr(pipeline, call), args, error, says, f"{call}({bad!r})")
        _refused(pipeline.get, (keys, tokens([20, 21])), IndicesError, "", "get(1 key, 2 pages)")
        for nbytes in (0, -1, view.nbytes + 1):
            _refused(pipeline.probe, (nbytes,), PoolError, "probe", f"probe({nbytes})")
        expect(pipeline.exists(keys) == 1, "the pipeline lost a key after refusing bad input")


def _refused(
    call: Callable[..., Any], args: tuple[Any, ...], error: type[Exception], says: str, what: str
) -> None:
    """``call(*args)`` raises ``error`` saying ``says``."""
    try:
        call(*args)
    except error as err:
        expect(says in str(err), f"{what}: {type(err).__name__} does not say {says!r}: {err}")
        return
    except Exception as err:
        raise ConformanceError(
            f"{what}: raised {type(err).__name__} ({err}), not {error.__name__}"
        ) from err
    raise ConformanceError(f"{what}: accepted; expected {error.__name__}")


#: Every check, by name, in the order :func:`~kvcr_policy.testing.check_backend` runs them.
CHECKS: Mapping[str, Callable[[Factory], None]] = {
    "byte_exact": check_byte_exact,
    "partial_hits": check_partial_hits,
    "keys": check_keys,
    "claims": check_claims,
    "faults": check_faults,
    "close": check_close,
    "bad_input": check_bad_input,
}
