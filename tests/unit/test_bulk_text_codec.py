"""The producer codec and the logical reader, checked by an independent decoder."""

from __future__ import annotations

import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpone.connectors.bulk_text_codec import (
    BulkTextError,
    BulkTextReader,
    BulkTextWriter,
    CodecColumn,
    ColumnKind,
    encode_record,
)
from tests.hostile_values import HOSTILE_BINARY, HOSTILE_TEXT
from tests.oracles import bulk_text_oracle as oracle

COLUMNS = [
    CodecColumn("id", ColumnKind.RAW),
    CodecColumn("text", ColumnKind.TEXT),
    CodecColumn("blob", ColumnKind.BINARY),
]
KINDS = ["raw", "text", "binary"]


def read_all(
    data: bytes, columns: list[CodecColumn] = COLUMNS, **kwargs: object
) -> list[tuple[object, ...]]:
    return list(BulkTextReader(io.BytesIO(data), columns, **kwargs))  # type: ignore[arg-type]


def write_all(rows: list[tuple[object, ...]]) -> bytes:
    out = io.BytesIO()
    writer = BulkTextWriter(out, COLUMNS)
    for row in rows:
        writer.write(row)  # type: ignore[arg-type]
    assert writer.records == len(rows)
    return out.getvalue()


def hostile_rows() -> list[tuple[object, ...]]:
    rows: list[tuple[object, ...]] = [(str(i), text, None) for i, text in enumerate(HOSTILE_TEXT)]
    rows += [(str(1000 + i), None, blob) for i, blob in enumerate(HOSTILE_BINARY)]
    rows += [(None, None, None), ("7", "dup", b"d"), ("7", "dup", b"d")]  # duplicate rows stay
    return rows


def test_hostile_values_agree_with_the_independent_decoder() -> None:
    rows = hostile_rows()
    data = write_all(rows)
    assert oracle.decode(data, KINDS) == rows
    assert read_all(data) == rows
    assert read_all(data, chunk_bytes=7) == rows  # records split across chunks


def test_exact_producer_bytes_for_reference_values() -> None:
    # Independently authored bytes for known values.
    assert encode_record(COLUMNS, ("1", "", b"")) == b"1\t\x1dE\t\x1dE\n"
    assert encode_record(COLUMNS, (None, None, None)) == b"\t\t\n"
    assert encode_record(COLUMNS, ("2", "a\tb\nc\rd\x1de\x1ff\x1eg", b"\x00\xff")) == (
        b"2\ta\x1dTb\x1dNc\x1dRd\x1dPe\x1dUf\x1dSg\t00ff\n"
    )
    assert encode_record(COLUMNS, ("3", "NULL", None)) == b"3\tNULL\t\n"
    assert encode_record(COLUMNS, ("4", "\x1dE", None)) == b"4\t\x1dPE\t\n"


@pytest.mark.parametrize("length", [127, 128, 16383, 16384])
def test_leb128_boundary_lengths_round_trip(length: int) -> None:
    rows: list[tuple[object, ...]] = [
        ("1", "é" * (length // 2) + "x" * (length % 2), b"\x01" * length)
    ]
    data = write_all(rows)
    assert read_all(data) == rows == oracle.decode(data, KINDS)


def test_hex_accepts_either_case_and_whitespace_between_pairs() -> None:
    assert read_all(b"1\tx\tAbcD\n") == [("1", "x", b"\xab\xcd")]
    assert read_all(b"1\tx\tab cd\x0bef\x0c01\r02\n") == [("1", "x", bytes.fromhex("abcdef0102"))]


# (input, code, record, column, offset)
ERRORS = [
    (b"1\tx\n", "row_width_mismatch", 1, "text", 3),
    (b"1\tx\tff\t\n", "row_width_mismatch", 1, "blob", 6),
    (b"1\tx\tff\n2\ty\tff", "missing_final_lf", 2, None, 13),
    (b"1\tx\xff\tff\n", "invalid_utf8", 1, "text", 3),
    (b"1\t\xe2\x82\tff\n", "invalid_utf8", 1, "text", 2),
    (b"1\t\xc3\xa9\x1dX\tff\n", "unknown_escape", 1, "text", 4),
    (b"1\tab\x1d\tff\n", "dangling_escape", 1, "text", 4),
    (b"1\ta\x1dE\tff\n", "misplaced_empty_marker", 1, "text", 3),
    (b"1\tx\tfg\n", "invalid_hex", 1, "blob", 5),
    (b"1\tx\tf\n", "invalid_hex", 1, "blob", 5),
    (b"1\tx\t ff\n", "invalid_hex", 1, "blob", 4),
    (b"1\tx\tff \n", "invalid_hex", 1, "blob", 6),
    (b"1\tx\tff\n2\ta\rb\tff\n", "cr_not_allowed", 2, "text", 10),
    (b"1\ta\x1eb\tff\n", "reserved_character", 1, "text", 3),
    (b"1\x1d\tx\tff\n", "reserved_character", 1, "id", 1),
    (b"1\r\tx\tff\n", "reserved_character", 1, "id", 1),
]


@pytest.mark.parametrize(("data", "code", "record", "column", "offset"), ERRORS)
def test_read_errors_name_their_position(
    data: bytes, code: str, record: int, column: str | None, offset: int
) -> None:
    with pytest.raises(BulkTextError) as caught:
        read_all(data, source="in.tsv")
    err = caught.value
    assert (err.code, err.details["record"], err.details["column"], err.details["offset"]) == (
        code,
        record,
        column,
        offset,
    )
    assert err.details["source"] == "in.tsv"
    assert f"record {record}" in str(err) and f"byte offset {offset}" in str(err)
    with pytest.raises(oracle.OracleError):
        oracle.decode(data, KINDS)


def test_record_budget_is_enforced_even_without_a_newline() -> None:
    with pytest.raises(BulkTextError) as caught:
        read_all(b"1\tx\tff\n2\t" + b"y" * 100 + b"\tff\n", max_record_bytes=20)
    assert caught.value.code == "record_too_large"
    assert caught.value.details["record"] == 2 and caught.value.details["offset"] == 7
    # A record that never ends is refused once the buffer passes the budget.
    with pytest.raises(BulkTextError) as endless:
        read_all(b"1\t" + b"z" * 5000, max_record_bytes=64, chunk_bytes=256)
    assert endless.value.code == "record_too_large"
    assert endless.value.details["offset"] == 64
    # Exactly at the budget is fine (LF included).
    assert read_all(b"1\tx\tff\n", max_record_bytes=7) == [("1", "x", b"\xff")]


def test_record_count_budget() -> None:
    data = b"1\tx\tff\n" * 3
    assert len(read_all(data, max_records=3)) == 3
    with pytest.raises(BulkTextError) as caught:
        read_all(data, max_records=2)
    assert caught.value.code == "too_many_records"
    assert caught.value.details["record"] == 3 and caught.value.details["offset"] == 14


def test_reader_freezes_its_columns() -> None:
    columns = list(COLUMNS)
    reader = BulkTextReader(io.BytesIO(b"1\tx\tff\n"), columns)
    columns.pop()
    assert list(reader) == [("1", "x", b"\xff")]


def test_unencodable_values_are_refused_by_the_producer() -> None:
    for cells in [
        ("", "x", None),
        ("a\tb", "x", None),
        ("1", "\ud800", None),
        ("1", b"x", None),
        ("1", "x", "ff"),
    ]:
        with pytest.raises(BulkTextError) as caught:
            encode_record(COLUMNS, cells)  # type: ignore[arg-type]
        assert caught.value.code == "unencodable_value"


def test_streaming_memory_does_not_hold_the_file() -> None:
    rows = 20_000
    data = b"".join(b"%d\thello\tabcd\n" % i for i in range(rows))
    reader = BulkTextReader(io.BytesIO(data), COLUMNS, chunk_bytes=4096)
    count = sum(1 for _ in reader)
    assert count == rows and reader.bytes_read == len(data)


text_values = st.one_of(st.none(), st.text(alphabet=st.characters(exclude_categories=["Cs"])))
binary_values = st.one_of(st.none(), st.binary(max_size=64))
raw_values = st.one_of(st.none(), st.from_regex(r"-?[0-9]{1,12}(\.[0-9]{1,6})?", fullmatch=True))
row_strategy = st.tuples(raw_values, text_values, binary_values)


@settings(max_examples=300, deadline=None)
@given(st.lists(row_strategy, max_size=20))
def test_round_trip_property(rows: list[tuple[object, ...]]) -> None:
    data = write_all(rows)
    assert read_all(data, chunk_bytes=5) == rows
    assert oracle.decode(data, KINDS) == rows


@settings(max_examples=500, deadline=None)
@given(
    st.lists(row_strategy, min_size=1, max_size=8),
    st.data(),
)
def test_any_corruption_is_rejected_or_decodes_differently(
    rows: list[tuple[object, ...]], data: st.DataObject
) -> None:
    original = write_all(rows)
    position = data.draw(st.integers(0, len(original) - 1))
    kind = data.draw(st.sampled_from(["flip", "delete", "insert", "truncate"]))
    if kind == "flip":
        mask = data.draw(st.integers(1, 255))
        corrupted = (
            original[:position] + bytes([original[position] ^ mask]) + original[position + 1 :]
        )
    elif kind == "delete":
        corrupted = original[:position] + original[position + 1 :]
    elif kind == "insert":
        extra = data.draw(st.binary(min_size=1, max_size=3))
        corrupted = original[:position] + extra + original[position:]
    else:
        corrupted = original[:position]
    if corrupted == original:
        return
    try:
        decoded = read_all(corrupted)
    except BulkTextError:
        return  # rejected with a typed error: fine
    if decoded == rows:
        # The format's alternative spellings (bulk-text-format.md): ASCII whitespace
        # between hex pairs, and hex digits in either case. Folding case is safe here:
        # a case change anywhere else (text) would have decoded differently.
        def strip(b: bytes) -> bytes:
            return b.translate(None, b" \x0b\x0c\r").lower()

        assert strip(corrupted) == strip(original)
