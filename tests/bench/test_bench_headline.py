"""Tests for kvcr_policy.bench.headline: the verdict line and the note on ratios above 1."""

from __future__ import annotations

from kvcr_policy.bench.headline import RATIO_NOTE, headline, ratio_note
from tests.tune.measured import result


def test_the_line_names_both_sides_its_own_arithmetic_and_the_check() -> None:
    done = result({"P,Q": [(14.0, 7.0)] * 3, "Q,P": [(15.0, 7.5)] * 3}, limit=15.0)
    data = done.to_dict()
    line = headline(data, done.baseline)
    restore, limit = data["restore_gigabytes_per_s"], data["limit_gigabytes_per_s"]
    assert line == (
        f"tuned vs base: restore {restore:.1f} GB/s = {restore / limit:.2f} of the limit "
        f"({limit:.1f} GB/s), 2.00x base; every byte verified"
    )
    assert ratio_note(data) is None  # no ratio above 1: nothing to explain


def test_unverified_bytes_and_ratios_above_one_are_said() -> None:
    done = result({"P,Q": [(20.0, 5.0)] * 3, "Q,P": [(20.0, 5.0)] * 3}, verified=False)
    data = done.to_dict()
    assert headline(data, "Q").endswith("4.00x base; RESTORED BYTES DID NOT MATCH")
    assert ratio_note(data) == RATIO_NOTE and "one copy" in RATIO_NOTE
