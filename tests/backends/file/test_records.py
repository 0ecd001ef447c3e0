"""The commit record: a round trip for any key, and any change of a covered byte is damage."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kvcr_policy.backends.file.records import (
    HEADER_BYTES,
    RECORD_BYTES,
    Damage,
    Record,
    decode,
    encode,
    tombstone,
)
from kvcr_policy.keys import MAX_KEY_BYTES

keys = st.text(min_size=1, max_size=300).filter(
    lambda k: (
        1 <= len(k.encode("utf-8", "surrogatepass")) <= MAX_KEY_BYTES
        and k.encode("utf-8", "surrogatepass").decode("utf-8", "ignore") == k
    )
)
records = st.builds(
    Record,
    slot=st.integers(0, 1 << 40),
    key=keys,
    page_crc=st.integers(0, (1 << 32) - 1),
    seq=st.integers(0, (1 << 63) - 1),
)


@given(records, st.integers(1, 1 << 40))
def test_a_record_decodes_to_itself(record: Record, page_bytes: int) -> None:
    raw = encode(record, page_bytes)
    assert len(raw) == RECORD_BYTES
    assert decode(raw, record.slot, page_bytes) == record


@given(records, st.data())
def test_any_changed_byte_the_record_covers_is_damage(record: Record, data: st.DataObject) -> None:
    raw = bytearray(encode(record, 4096))
    covered = [*range(44), *range(HEADER_BYTES, HEADER_BYTES + len(record.key.encode()))]
    at = data.draw(st.sampled_from(covered))
    raw[at] ^= data.draw(st.integers(1, 255))
    assert isinstance(decode(bytes(raw), record.slot, 4096), Damage)


def test_a_record_elsewhere_or_for_another_page_size_is_damage() -> None:
    raw = encode(Record(7, "k", 1, 1), 4096)
    assert decode(raw, 8, 4096) is Damage.SLOT
    assert decode(raw, 7, 8192) is Damage.PAGE_BYTES


def test_zeros_and_tombstones_are_free_and_a_torn_tombstone_is_damage() -> None:
    assert decode(bytes(RECORD_BYTES), 3, 4096) is None
    assert decode(tombstone(3), 3, 4096) is None
    torn = bytearray(tombstone(3))
    torn[9] ^= 1
    assert decode(bytes(torn), 3, 4096) is Damage.CRC
