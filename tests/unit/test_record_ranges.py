"""Whole-record ranges read into one reused buffer give back exactly the stream's bytes."""

from __future__ import annotations

import io

from hypothesis import given
from hypothesis import strategies as st

from dpone.preparation.ranges import RecordRanges


@given(
    st.lists(st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")), max_size=30),
    st.booleans(),
    st.integers(min_value=1, max_value=64),
)
def test_ranges_and_trailing_bytes_are_the_stream(
    records: list[bytes], unfinished: bool, chunk: int
) -> None:
    data = b"".join(r + b"\n" for r in records) + (b"tail" if unfinished else b"")
    ranges = RecordRanges(io.BufferedReader(io.BytesIO(data)), chunk, carry_limit=1 << 20)
    pieces = []
    for buffer, end in ranges:
        assert end > 0 and buffer[end - 1 : end] == b"\n"
        pieces.append(bytes(buffer[:end]))  # a copy: the buffer is reused
    assert not ranges.too_long
    assert b"".join(pieces) + ranges.trailing == data
    assert ranges.trailing == (b"tail" if unfinished else b"")
    assert all(p.count(b"\n") >= 1 for p in pieces)


def test_a_record_longer_than_the_carry_limit_stops_the_ranges() -> None:
    data = b"short\n" + b"x" * 100 + b"\nafter\n"
    ranges = RecordRanges(io.BufferedReader(io.BytesIO(data)), 8, carry_limit=50)
    got = [bytes(buffer[:end]) for buffer, end in ranges]
    assert got == [b"short\n"] and ranges.too_long
