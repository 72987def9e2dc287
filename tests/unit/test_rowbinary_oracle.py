"""The RowBinary oracle refuses what a writer must not emit: rows beyond the count."""

from __future__ import annotations

import struct

import pytest

from tests.oracles.rowbinary_oracle import decode_rows

TYPES = ["Int32", "Nullable(String)"]
ROW = struct.pack("<i", 7) + b"\x00\x03abc"  # (7, b"abc")


def test_exactly_the_expected_rows_decode() -> None:
    assert decode_rows(ROW * 2, TYPES, rows=2) == [(7, b"abc"), (7, b"abc")]
    assert decode_rows(b"", TYPES, rows=0) == []


def test_a_trailing_whole_row_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^9 trailing bytes after the 2 expected rows$"):
        decode_rows(ROW * 3, TYPES, rows=2)


def test_trailing_bytes_that_are_not_a_row_are_refused() -> None:
    with pytest.raises(ValueError, match=r"^1 trailing bytes after the 1 expected rows$"):
        decode_rows(ROW + b"\x00", TYPES, rows=1)


def test_a_missing_row_is_refused() -> None:
    with pytest.raises(ValueError, match="truncated RowBinary"):
        decode_rows(ROW, TYPES, rows=2)


def test_a_partial_last_row_is_refused_without_a_count() -> None:
    with pytest.raises(ValueError, match="truncated RowBinary"):
        decode_rows(ROW + ROW[:5], TYPES)
