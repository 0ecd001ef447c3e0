"""``bench --sweep``: the matrices cover what they claim, a row's figures come from its run's
own limits (injected results, no timing), and the options a matrix sets are refused."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvcr_policy.bench.result import BenchResult, Run
from kvcr_policy.bench.setup import BenchError, BenchSetup
from kvcr_policy.bench.shape import model_shape
from kvcr_policy.bench.sweep import MATRICES, SweepShape, run_sweep, sweep_row, sweep_table
from kvcr_policy.bench.sweep_command import check_sweep
from kvcr_policy.bench.tp import shard_geometry
from kvcr_policy.model.shape import ShapeOptions


def page_bytes(shape: SweepShape) -> int:
    setup = shape.setup(BenchSetup(target="cuda"))
    pool = model_shape(setup).pool(shape.layout, shape.tokens)  # type: ignore[arg-type]
    return shard_geometry(pool, setup.tp or setup.ranks).page_bytes


def test_the_gpu_matrix_covers_every_axis_the_limit_is_asked_on() -> None:
    shapes = MATRICES["cuda"]
    sizes = {page_bytes(shape) for shape in shapes}
    assert min(sizes) == 256 << 10 and max(sizes) == 16 << 20
    assert {shape.layout for shape in shapes} == {"layer_first", "page_first",
                                                  "page_first_direct", "page_head"}  # fmt: skip
    assert {bool(shape.dims.get("mla")) for shape in shapes} == {False, True}
    assert {shape.scatter for shape in shapes} == {False, True}
    assert min(s.tokens for s in shapes) == 16384 and max(s.tokens for s in shapes) == 115968
    assert any(s.ranks == 2 and s.devices == (0, 0) for s in shapes)
    # The two command lines of the CPU's done-when are rows of its matrix.
    cpu = {(tuple(sorted(s.dims.items())), s.scatter, s.tokens) for s in MATRICES["cpu"]}
    mha = {"layers": 16, "heads": 8, "head_dim": 128, "dtype": "bfloat16", "page_size": 16}
    mla = {"layers": 8, "heads": 1, "head_dim": 576, "dtype": "bfloat16", "page_size": 32,
           "mla": True}  # fmt: skip
    for dims in (mha, mla):
        assert (tuple(sorted(dims.items())), True, 16384) in cpu


def result(p: float, q: float, store: float, verified: bool = True) -> BenchResult:
    """P at ``p`` and Q at ``q`` of a 50 GB/s limit in both orders; stores at ``store``."""
    runs = tuple(
        Run(0, order, side, side, rate * 50, 50.0, verified, 20.0)
        for order in ("P,Q", "Q,P")
        for side, rate in (("P", p), ("Q", q))
    )
    return BenchResult(
        target="cuda", backend="dram", geometry="small", layout="layer_first", mla=False,
        tokens=16384, pages=1024, page_bytes=512 << 10, nbytes=512 << 20, scatter=True,
        repeat=1, baseline="Q", runs=runs, limit="one copy", profiles={},
        store_gbps={"P": store * 50, "Q": 1.0}, store_host_copy_gbps={"P": 20.0, "Q": 20.0},
        extra={"device": "GPU 0"},
    )  # fmt: skip


def test_a_row_is_p_and_the_baseline_over_their_own_limits() -> None:
    shape = MATRICES["cpu"][2]
    row = sweep_row(shape, result(0.96, 0.3, 0.92), screen_pct=5)
    assert row["orders"] == {
        "P,Q": {"ratio_to_limit": 0.96, "baseline_ratio_to_limit": 0.3},
        "Q,P": {"ratio_to_limit": 0.96, "baseline_ratio_to_limit": 0.3},
    }
    assert row["store_ratio_to_limit"] == 0.92 and row["baseline_store_ratio_to_limit"] == 0.02
    assert row["at_least_baseline"] and row["verified"] and row["screen"]["passed"]
    slower = sweep_row(shape, result(0.5, 0.8, 0.5, verified=False), screen_pct=5)
    assert not slower["at_least_baseline"] and not slower["verified"]
    assert not slower["screen"]["passed"]
    table = sweep_table([row, slower]).splitlines()
    assert table[0].startswith("| shape | layout | tokens | page | restore P (P,Q / Q,P) |")
    assert table[2] == ("| small, scattered | layer_first | 16384 | 512 KiB | 0.960 / 0.960 | "
                        "0.300 / 0.300 | 0.920 | 0.020 | yes | yes |")  # fmt: skip
    assert table[3].endswith("| NO | NO |")


def test_a_store_below_the_baselines_is_not_at_least_the_baseline() -> None:
    shape = MATRICES["cpu"][2]
    # Restores above the baseline's in both orders; the store at 0.01 of the limit against
    # the baseline's 0.02 (result() stores Q at 1 GB/s of 50).
    row = sweep_row(shape, result(0.96, 0.3, 0.01), screen_pct=None)
    assert not row["at_least_baseline"]
    assert sweep_table([row]).splitlines()[2].endswith("| 0.010 | 0.020 | NO | yes |")


def test_every_shape_runs_in_order_with_its_own_setup() -> None:
    shapes = MATRICES["cpu"][:3]
    base = BenchSetup(profile="throughput", vs="default", repeat=2, overrides={"a": "1"})
    seen: list[BenchSetup] = []
    said: list[str] = []

    def run(i: int) -> BenchResult:
        seen.append(shapes[i].setup(base))
        return result(0.9, 0.5, 0.9)

    rows = run_sweep(shapes, run, None, said.append)
    assert [row["shape"] for row in rows] == [shape.label for shape in shapes]
    assert all(s.repeat == 2 and s.overrides == {"a": "1"} and s.exists_keys == 1 for s in seen)
    assert [s.scatter for s in seen] == [shape.scatter for shape in shapes]
    assert sum("done" in line for line in said) == len(shapes)
    assert replace(seen[1], exists_keys=100_000).dims == {
        "layers": 8,
        "heads": 1,
        "head_dim": 576,
        "dtype": "bfloat16",
        "page_size": 32,
    }
    assert seen[1].mla


@pytest.mark.parametrize(
    ("given", "named"),
    [
        ({"shape": ShapeOptions(geometry="small")}, "--geometry"),
        ({"shape": ShapeOptions(mla=False)}, "--mla"),
        ({"layout": "page_first"}, "--layout"),
        ({"tokens": 4096, "scatter": True}, "--tokens, --scatter"),
        ({"ranks": 2, "devices": "0,0"}, "--ranks, --devices"),
    ],
)
def test_options_each_shape_sets_are_refused_beside_a_sweep(given: dict, named: str) -> None:
    options = {"shape": ShapeOptions(), "layout": "layer_first", "tokens": 8192, "scatter": False,
               "ranks": 1, "devices": None, "plot": None, "metrics": None, **given}  # fmt: skip
    with pytest.raises(BenchError, match=f"drop {named}"):
        check_sweep(**options)
    check_sweep(ShapeOptions(), "layer_first", 8192, False, 1, None, None, None)  # none given
