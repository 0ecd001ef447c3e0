"""A request's reply deadline counts progress, not total time (decided on injected counts).

A SEND is answered once its pages arrived; on a busy host that can take longer than
``op_timeout_s`` while bytes keep moving. The connection waits as long as UCX messages keep
completing on it, and fails only after ``op_timeout_s`` with no reply and none completed. The
stand-in below holds what :meth:`Connection._no_reply` reads (its pending requests, its link's
completion count, its loop's timers), so the decision is tested without a real loop or peer.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from kvcr_policy.backends.peer.client.connection import Connection, _Pending


class Stand:
    def __init__(self) -> None:
        self.link = SimpleNamespace(completions=0)
        self.timers: list[tuple[float, Any]] = []
        self.failed: list[str] = []
        self._pending: dict[int, _Pending] = {}
        self.worker = SimpleNamespace(later=self._later)

    @property
    def completions(self) -> int:
        return int(self.link.completions)

    def _later(self, delay: float, fn: Any) -> Any:
        self.timers.append((delay, fn))
        return SimpleNamespace(cancel=lambda: None)

    def fail(self, reason: str) -> None:
        self.failed.append(reason)

    def _no_reply(self, number: int, moved: int, limit: float, knob: str) -> None:
        Connection._no_reply(self, number, moved, limit, knob)  # type: ignore[arg-type]

    def fire(self) -> None:
        _, fn = self.timers.pop(0)
        fn()


def test_no_reply_and_no_message_completed_fails_at_the_limit() -> None:
    conn = Stand()
    conn._pending[7] = _Pending("SEND", lambda reply: None, SimpleNamespace(cancel=lambda: None))
    conn._no_reply(7, 0, 30.0, "transport.op_timeout_s")
    assert conn.failed == ["SEND got no reply within 30.0 s (transport.op_timeout_s)"]
    assert conn.timers == []


def test_each_limit_with_messages_completed_rearms_the_deadline() -> None:
    conn = Stand()
    conn._pending[7] = _Pending("SEND", lambda reply: None, SimpleNamespace(cancel=lambda: None))
    for _ in range(5):  # five limits in a row, bytes moving in each: still waiting
        conn.link.completions += 3
        moved = conn.link.completions - 3
        conn._no_reply(7, moved, 30.0, "transport.op_timeout_s")
        assert conn.failed == [] and len(conn.timers) == 1
        conn.timers.clear()
    conn._no_reply(7, conn.link.completions, 30.0, "transport.op_timeout_s")  # a silent limit
    assert conn.failed == ["SEND got no reply within 30.0 s (transport.op_timeout_s)"]
    assert conn.timers == []


def test_a_chain_of_rearmed_timers_fails_once_the_bytes_stop() -> None:
    conn = Stand()
    conn._pending[3] = _Pending("SEND", lambda reply: None, SimpleNamespace(cancel=lambda: None))
    conn._no_reply(3, -1, 2.0, "transport.op_timeout_s")  # something moved since the send
    conn.link.completions = 10
    conn.fire()  # re-armed at 0 completions; 10 since: waits again
    assert conn.failed == [] and len(conn.timers) == 1
    conn.fire()  # nothing since: fails
    assert conn.failed == ["SEND got no reply within 2.0 s (transport.op_timeout_s)"]


def test_an_answered_request_is_left_alone() -> None:
    conn = Stand()
    conn._no_reply(9, 0, 30.0, "transport.op_timeout_s")
    assert conn.failed == [] and conn.timers == []
