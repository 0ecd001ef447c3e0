"""Tests for kvcr_policy.config.rates: every rate names its unit; a bare number is refused."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvcr_policy.config.rates import RATE_UNITS, gb_per_s_from_text, parse_rate, spell_gb_per_s

pytestmark = pytest.mark.usefixtures("clean_env")


@pytest.mark.parametrize(
    ("text", "bytes_per_s"),
    [
        ("50GB/s", 50e9),
        ("400Gbit/s", 50e9),  # the NIC's "400 Gbps" is 50 GB/s, not 400
        ("46.6GiB/s", 46.6 * 2**30),
        (" 800 Mbit/s ", 1e8),
        ("1B/s", 1.0),
        (".5TB/s", 5e11),
    ],
)
def test_each_form_is_bytes_per_second(text: str, bytes_per_s: float) -> None:
    assert parse_rate(text) == pytest.approx(bytes_per_s, rel=1e-12)


@pytest.mark.parametrize(
    ("value", "got"),
    [
        ("50", "got a bare number '50'"),
        (50, "got a bare number 50"),
        (12.5, "got a bare number 12.5"),
        ("100Gbps", "got '100Gbps'"),  # ambiguous: refused, never guessed
        ("100Gb/s", "got '100Gb/s'"),
        ("50GB/s junk", "got '50GB/s junk'"),
        ("nan GB/s", "got 'nan GB/s'"),
        ("５０GB/s", "got '５０GB/s'"),
        (True, "got bool True"),
    ],
)
def test_anything_else_is_refused_listing_the_forms(value: object, got: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_rate(value)
    message = str(caught.value)
    assert got in message
    assert "50GB/s, 400Gbit/s, 46.6GiB/s" in message and "Gbit/s" in message


@given(
    number=st.decimals(min_value=0, max_value=10**6, places=3, allow_nan=False),
    unit=st.sampled_from(sorted(RATE_UNITS)),
)
def test_a_rate_parses_to_its_number_times_its_unit(number: object, unit: str) -> None:
    assert parse_rate(f"{number}{unit}") == pytest.approx(float(number) * RATE_UNITS[unit])  # type: ignore[arg-type]


@given(st.floats(min_value=0.001, max_value=100000, allow_nan=False, allow_infinity=False))
def test_a_config_rate_is_written_back_as_text_that_parses_to_it(gb_per_s: float) -> None:
    text = spell_gb_per_s(gb_per_s)
    assert text is not None and text.endswith("GB/s")
    assert gb_per_s_from_text(text) == gb_per_s
    assert spell_gb_per_s(None) is None and gb_per_s_from_text(None) is None


def test_the_config_field_takes_a_rate_and_shows_it_with_its_unit() -> None:
    from kvcr_policy.config.loading import load_config

    loaded = load_config(overrides={"observability.link_limit_gbps": "400Gbit/s"})
    assert loaded.config.observability.link_limit_gbps == 50.0  # held in GB/s
    shown = loaded.config.model_dump(mode="json")["observability"]["link_limit_gbps"]
    assert shown == "50.0GB/s"
    assert load_config().config.observability.link_limit_gbps is None  # the default: unset
