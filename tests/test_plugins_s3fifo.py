"""The example plugin's ``s3fifo`` eviction policy behaves as S3-FIFO: new pages are demoted
quickly, pages read while new are promoted, the ghost readmits a returning key to the main
queue, and pages that may not go keep their place."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from kvcr_policy_example.s3fifo import S3FIFOOptions, S3FIFOPolicy

from kvcr_policy.config.loading import load_config
from tests.support.paths import ROOT


def _policy(capacity: int = 10, **options: object) -> S3FIFOPolicy:
    return S3FIFOPolicy(capacity, S3FIFOOptions.model_validate(options))


def _evict(policy: S3FIFOPolicy, count: int, keep: frozenset[int] = frozenset()) -> list[int]:
    chosen = policy.victims(count, lambda slot: slot not in keep)
    for slot in chosen:
        policy.forget(slot)
    return chosen


def test_a_scan_of_new_pages_leaves_the_pages_read_while_new() -> None:
    policy = _policy()  # small queue: 1 slot of 10
    for slot in range(10):
        policy.admit(slot, f"k{slot}")
    policy.touch(0)
    policy.touch(1)
    # 0 and 1 were read while new: they move to the main queue; 2, 3, 4 leave first.
    assert _evict(policy, 3) == [2, 3, 4]
    assert _evict(policy, 5) == [5, 6, 7, 8, 9]  # then the rest of the new ones


def test_a_returning_key_enters_the_main_queue() -> None:
    policy = _policy()
    for slot in range(3):
        policy.admit(slot, f"k{slot}")
    assert _evict(policy, 1) == [0]  # k0 is remembered in the ghost
    policy.admit(7, "k0")  # back, in another slot: straight into the main queue
    policy.admit(8, "k8")
    # The small queue (1, 2, 8) drains before the main queue (7) is touched.
    assert _evict(policy, 3) == [1, 2, 8]
    assert _evict(policy, 1) == [7]


def test_the_main_queue_gives_a_second_chance_per_read() -> None:
    policy = _policy(3)
    for slot, key in ((0, "a"), (1, "b"), (2, "c")):
        policy.admit(slot, key)
    policy.touch(0)
    policy.touch(1)
    assert _evict(policy, 1) == [2]  # a and b were read while new: both move to main
    policy.touch(0)  # a is read again in the main queue: it goes round once more
    assert _evict(policy, 1) == [1]
    assert _evict(policy, 1) == [0]


def test_pages_that_may_not_go_keep_their_place() -> None:
    policy = _policy()
    for slot in range(4):
        policy.admit(slot, f"k{slot}")
    assert _evict(policy, 2, keep=frozenset({0, 1})) == [2, 3]
    assert _evict(policy, 1) == [0]  # still the oldest of the small queue


BAD_OPTIONS = [{"small_share": 0}, {"small_share": 1.0}, {"small_share": float("nan")},
               {"promote_reads": 0}, {"promote_reads": 4}, {"ghost": 3}]  # fmt: skip


@pytest.mark.parametrize("options", BAD_OPTIONS)
def test_options_are_bounded(options: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        S3FIFOOptions.model_validate(options)


def test_the_readme_s_profile_selects_it(tmp_path: Path) -> None:
    readme = (ROOT / "plugins" / "kvcr-policy-example" / "README.md").read_text(encoding="utf-8")
    snippet = readme.split("- `s3fifo` (eviction)", 1)[1].split("```toml", 1)[1].split("```")[0]
    profile = tmp_path / "s3fifo.toml"
    profile.write_text(textwrap.dedent(snippet), encoding="utf-8")
    loaded = load_config(profile, environ={})
    assert loaded.config.eviction.strategy == "s3fifo"
    assert loaded.config.eviction.options == {"small_share": 0.1, "promote_reads": 1}
    assert loaded.origin("eviction.options.small_share") == f"profile {profile} [eviction.options]"
