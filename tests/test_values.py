"""Byte sizes: decimal and binary byte units are read, bit units are refused with the accepted
forms, and a size is echoed as written with its binary size beside it (``show``, ``plan``)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvcr_policy import load_config
from kvcr_policy.errors import ArgumentError, ConfigError
from kvcr_policy.values import as_written, parse_size
from tests.support.commands import run_main

pytestmark = pytest.mark.usefixtures("clean_env")

DECIMAL = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
BINARY = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
BITS = ["Kb", "Mb", "Gb", "Tb", "Kib", "Gib", "Gbit", "gbit", "Mbits"]


@given(st.integers(1, 1000), st.sampled_from(sorted({**DECIMAL, **BINARY}.items())))
def test_byte_units_read_as_bytes_whatever_their_case(n: int, unit: tuple[str, int]) -> None:
    name, factor = unit
    for spelled in (name, name.lower()):
        assert parse_size(f"{n}{spelled}", what="--size", high=1 << 60) == n * factor


@given(st.integers(1, 1000), st.sampled_from(BITS))
def test_bit_units_are_refused_naming_the_accepted_forms(n: int, unit: str) -> None:
    with pytest.raises(ArgumentError) as info:
        parse_size(f"{n}{unit}", what="--size")
    message = str(info.value)
    assert "bits" in message and "GB" in message and "GiB" in message


@pytest.mark.parametrize(
    ("text", "n", "shown"),
    [
        ("64GB", 64 * 10**9, "64GB (59.6 GiB)"),
        ("64GiB", 64 << 30, "64GiB"),
        ("1048576", 1 << 20, "1048576 (1.0 MiB)"),
        (None, 64 << 30, "64GiB"),
        ("300", 300, "300 (300 B)"),
    ],
)
def test_a_size_is_echoed_as_written_with_its_binary_size(
    text: str | None, n: int, shown: str
) -> None:
    assert as_written(text, n) == shown


def test_a_loaded_size_remembers_how_it_was_written() -> None:
    loaded = load_config(environ={}, overrides={"placement.capacity_bytes": "64GB"}, dotenv=False)
    assert loaded.size("placement.capacity_bytes") == "64GB (59.6 GiB)"
    with pytest.raises(ConfigError, match="bits"):
        load_config(environ={}, overrides={"placement.capacity_bytes": "64Gb"}, dotenv=False)


def test_show_refuses_gigabits_and_echoes_gigabytes(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(capsys, "show", "--set", "placement.capacity_bytes=64Gb")
    assert code == 2
    assert "'64Gb' is in bits" in err and "KiB, MiB, GiB" in err and "KB, MB, GB" in err
    code, out, _ = run_main(capsys, "show", "--set", "placement.capacity_bytes=64GB")
    assert code == 0
    assert "64GB (59.6 GiB)" in out
