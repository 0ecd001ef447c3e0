"""Crash consistency with real SIGKILLs: 50 writer processes killed at random points, then a
restart serves no wrong page, and every damaged entry is a miss.

Each writer (a forked child) opens the same directory (the previous one's lock died with it),
sets batches of small pages whose bytes are a function of their key, deletes some, and keeps
a tier of fewer slots than keys, so slots are evicted and reused (tombstones) all the time.
Writers alternate the sync policies. The parent kills each at a random moment.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.backends.file.tiers import Rig, expected, small_geometry

KILLS = 50
KEYS = [f"key-{i}" for i in range(64)]
SLOTS = 24


def _writer(root: str, seed: int, sync: str, stored: Any) -> None:
    rng = random.Random(seed)
    rig = Rig(Path(root), small_geometry(), SLOTS, sync=sync)
    while True:
        batch = rng.sample(KEYS, rng.randint(1, 12))
        rig.set(batch)
        stored.set()  # one set is done: from here on, a kill lands anywhere in the next ones
        if rng.random() < 0.2:
            rig.tier.drop(rng.sample(KEYS, 3))


def _served(rig: Rig) -> tuple[int, int]:
    """(pages served correctly, pages served wrong) over every key present."""
    right = wrong = 0
    page_bytes = rig.geometry.page_bytes
    for key in KEYS:
        if rig.tier.contains([key]) and rig.get([key]) == [True]:
            if rig.page(0).tobytes() == expected(key, page_bytes):
                right += 1
            else:
                wrong += 1
    return right, wrong


@pytest.mark.slow
def test_50_sigkilled_writers_then_a_restart_serve_no_wrong_page(tmp_path: Path) -> None:
    fork = multiprocessing.get_context("fork")
    rng = random.Random(1234)
    for kill in range(KILLS):
        stored = fork.Event()
        child = fork.Process(
            target=_writer,
            args=(str(tmp_path), kill, ("none", "batch")[kill % 2], stored),
            daemon=True,
        )
        child.start()
        # Evidence first (the writer has stored once, however busy the host), then a random
        # point inside the writes that follow.
        assert stored.wait(120), f"writer {kill} stored nothing within 120 s"
        time.sleep(rng.uniform(0.0, 0.05))
        assert child.pid is not None and child.is_alive(), f"writer {kill} ended early"
        os.kill(child.pid, signal.SIGKILL)
        child.join(10)
        assert child.exitcode == -signal.SIGKILL

    rig = Rig(tmp_path, small_geometry(), SLOTS, check="records")
    try:
        right, wrong = _served(rig)
        assert wrong == 0
        assert right > 0, "the writers stored nothing: kill them later"
        live = [k for k in KEYS if rig.tier.contains([k])]
        where = {k: int(rig.tier.fmap[rig.tier.store.lookup([k])[0]]) for k in live}
        stride, directory = rig.tier.files.stride, rig.tier.files.directory
    finally:
        rig.close()

    # Damage what a power loss could leave torn: three pages' bytes.
    damaged = live[:3]
    with open(directory / "slots", "r+b") as f:
        for key in damaged:
            f.seek(where[key] * stride + 7)
            f.write(b"\xff\x00\xff")
    for check in ("pages", "records"):
        rig = Rig(tmp_path, small_geometry(), SLOTS, check=check)
        try:
            right, wrong = _served(rig)
            assert wrong == 0
            assert right == len(live) - len(damaged)
            assert all(rig.tier.contains([k]) == 0 for k in damaged)
        finally:
            rig.close()
