"""The frame budget's fairness (no UCX): charged bytes only, a share per tenant, and room made
for a tenant under its share from the frames of tenants over theirs (red team 2026-12-b, B2)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kvcr_policy.backends.peer.server.budget import FrameBudget

LIMIT = 256


class Frame:
    """A connection's frame in progress: what it holds, and whether it was preempted."""

    def __init__(self, budget: FrameBudget, tenant: str) -> None:
        self.budget, self.tenant, self.held, self.preempted = budget, tenant, 0, False

    def preempt(self) -> None:
        self.preempted = True
        self.budget.give(self, self.held)
        self.held = 0


ops = st.lists(
    st.tuples(st.sampled_from("abc"), st.integers(0, 5), st.integers(-LIMIT, LIMIT)),
    max_size=60,
)


@given(ops)
def test_the_budget_is_shared_fairly_and_never_overdrawn(steps: list) -> None:
    budget = FrameBudget(LIMIT)
    frames: dict[tuple[str, int], Frame] = {}
    for tenant, number, amount in steps:
        frame = frames.setdefault((tenant, number), Frame(budget, tenant))
        if amount <= 0:  # the frame completes (or part of a charge comes back)
            back = min(frame.held, -amount)
            budget.give(frame, back)
            frame.held -= back
            continue
        share = budget.share(tenant)
        mine = budget.held(tenant)
        granted = budget.take(frame, tenant, amount)
        preempted = [f for f in frames.values() if f.preempted]
        if granted:
            frame.held += amount
            assert budget.held(tenant) <= share
        elif mine + amount <= share:  # refused under its share: nobody over theirs was left
            assert budget.total + amount > LIMIT
            assert not any(budget.held(t) > share for t in "abc" if t != tenant)
        else:  # over its own share: refused, and nobody else pays for it
            assert not preempted
        assert all(f.tenant != tenant for f in preempted)  # room comes from other tenants
        assert budget.total == sum(f.held for f in frames.values()) <= LIMIT
        for t in "abc":
            assert budget.held(t) == sum(f.held for (x, _), f in frames.items() if x == t)
        for f in preempted:
            f.preempted = False


def test_a_tenant_alone_may_use_the_whole_budget_until_another_asks() -> None:
    budget = FrameBudget(LIMIT)
    hog = [Frame(budget, "bob") for _ in range(4)]
    for frame in hog:
        assert budget.take(frame, "bob", LIMIT // 4)
        frame.held = LIMIT // 4
    victim = Frame(budget, "alice")
    assert budget.take(victim, "alice", 100)  # bob is over his share of two: he makes room
    assert sum(frame.preempted for frame in hog) == 2
    assert not budget.take(hog[0], "bob", 1) or budget.held("bob") <= LIMIT // 2
    assert budget.total <= LIMIT
