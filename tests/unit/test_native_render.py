"""The compiled renderer against the Python one: the same record bytes, or the same error.

Every value of a hostile pool (every Python type a driver could hand, and the edges of
each) goes into a column of every type of the policy; the Python path
(``RecordWriter(native=False)``: ``render.py`` with the codec) is the specification.
The compiled renderer must give its exact bytes for every row it takes, and a row it
declines must still end with the Python path's bytes or error (code, record, column).
"""

from __future__ import annotations

import datetime as dt
import decimal
import enum
import io
import math
import struct
import uuid
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from dpone.contracts.schema import SourceColumn
from dpone.errors import DponeError
from dpone.exporters import native_render
from dpone.exporters.records import RecordWriter
from dpone.typepolicy import ColumnPlan, plan_column
from dpone.typepolicy.source_types import SourceType, parse_source_type
from tests.hostile_values import HOSTILE_BINARY, HOSTILE_TEXT
from tests.plugins.type_samples import GUID, TYPES


def test_the_compiled_renderer_is_built_for_these_tests() -> None:
    """Every test here is about it: a missing build fails, never skips."""
    assert native_render.available(), native_render.unavailable_reason()


class Color(enum.IntEnum):
    RED = 1


class MyStr(str):
    pass


class MyFloat(float):
    pass


class MyBytes(bytes):
    pass


class MyDecimal(decimal.Decimal):
    pass


class MyUUID(uuid.UUID):
    pass


class MyDatetime(dt.datetime):
    pass


TZ = dt.timezone(dt.timedelta(hours=5, minutes=30))

INTS: list[Any] = [0, 1, -1, 2, 7, 255, 256, -32768, 2**31 - 1, -(2**31), 2**63 - 1]
INTS += [-(2**63), 2**63, -(2**63) - 1, 10**30, -(10**37), 10**5000, True, False, Color.RED]
FLOATS: list[Any] = [0.0, -0.0, 0.1, 0.5, 1.5, -1.5, 2.0, 1234.5, -5165434168404.59, 1e-4]
FLOATS += [9.99e-5, 1e-5, 0.000123, 1e14, 1e15, 1.5e15, 1e16, 123456789012345.6, 0.1 + 0.2]
FLOATS += [99999999999999.9, 999999999999999.0, 0.30000000000000004, 1 / 3, 2.5e-7]
FLOATS += [math.nan, math.inf, -math.inf, 5e-324, 1.7976931348623157e308, 16777217.0]
FLOATS += [3.4028234663852886e38, 3.4028235677973366e38, 0.10000000149011612, 1e-45]
FLOATS += [1.401298464324817e-45, -2.5, MyFloat(1.5), 1e22, 1e23, 4.35, 0.07]
DECIMALS: list[Any] = [decimal.Decimal(t) for t in ("1.50", "-0.00", "1E+2", "NaN", "sNaN")]
DECIMALS += [decimal.Decimal(t) for t in ("Infinity", "-Infinity", "-1E-30", "0", "-0")]
DECIMALS += [decimal.Decimal("9" * 28 + "." + "9" * 10), decimal.Decimal("-12.345")]
DECIMALS += [decimal.Decimal("922337203685477.5807"), MyDecimal("1.5")]
TEXTS: list[Any] = [
    *HOSTILE_TEXT,
    "2020-01-02",
    "2020-01-02 03:04:05.1234567",
    "2020-01-02 03:04:05",
    "12:00:00",
    "12:00:00.1234567",
    "2020-01-02 03:04:05.1234567 +05:30",
    GUID,
    GUID.upper(),
    "6F9619ff-8B86-d011-B42D-00c04FC964ff",
    "{" + GUID + "}",
    GUID.replace("-", ""),
    "urn:uuid:" + GUID,
    GUID[:8] + "x" + GUID[9:],
    "-" * 36,
    "é" * 36,
    GUID[:35] + "g",
    "1.50",
    " 1.5 ",
    "1_000",
    "١٢",
    "abc",
    "-0",
    "-0.0",
    "1e5",
    "12345678901234567890.25",
    "0",
    "1",
    "\ud800",
    "a\udfffb",
    MyStr("x"),
]
BINARIES: list[Any] = [*HOSTILE_BINARY, bytearray(b"ab"), memoryview(b"cd"), MyBytes(b"e")]
TIMES: list[Any] = [
    dt.datetime(2020, 1, 2, 3, 4, 5, 123456),
    dt.datetime(2020, 1, 2, 3, 4, 5),
    dt.datetime(2020, 1, 2, 3, 4, 5, 3000),
    dt.datetime(2020, 1, 2, 3, 4, 5, 1500),
    dt.datetime(2020, 1, 2, 3, 4),
    dt.datetime(999, 12, 31, 23, 59, 59),
    dt.datetime(1000, 1, 1),
    dt.datetime(1, 1, 1),
    dt.datetime(9999, 12, 31, 23, 59, 59, 999999),
    dt.datetime(2020, 1, 2, 3, 4, 5, 7, tzinfo=TZ),
    MyDatetime(2020, 1, 2),
    dt.date(2020, 1, 2),
    dt.date(1, 1, 1),
    dt.date(9999, 12, 31),
    dt.time(23, 59, 59, 999999),
    dt.time(0, 0),
    dt.time(12, 0, tzinfo=TZ),
    dt.timedelta(seconds=1),
    uuid.UUID(GUID),
    uuid.UUID(int=0),
    uuid.UUID(int=2**128 - 1),
    MyUUID(GUID),
]
OTHERS: list[Any] = [None, object(), [1], (1,), {"a": 1}]
POOL = INTS + FLOATS + DECIMALS + TEXTS + BINARIES + TIMES + OTHERS


def _columns(types: list[str]) -> tuple[list[SourceType], list[ColumnPlan]]:
    parsed = [parse_source_type(t, column=f"c{i}") for i, t in enumerate(types)]
    plans = [plan_column(SourceColumn(f"c{i}", t, True)) for i, t in enumerate(types)]
    return parsed, plans


def written(types: list[str], rows: list[Any], *, native: bool) -> bytes | tuple[Any, ...]:
    """The file of ``rows``, or the error (its type, code, details and message)."""
    parsed, plans = _columns(types)
    stream = io.BytesIO()
    writer = RecordWriter(stream, parsed, plans, native=native)
    try:
        writer.write(rows)
    except DponeError as exc:
        return type(exc), exc.code, exc.details, exc.message
    except ValueError as exc:  # a row of the wrong width, from zip(strict=True)
        return type(exc), str(exc)
    assert writer.records == len(rows) and writer.bytes == len(stream.getvalue())
    return stream.getvalue()


def taken(types: list[str], rows: list[Any]) -> bytes | None:
    """The compiled renderer's bytes of ``rows`` when it takes all of them, else None."""
    parsed, plans = _columns(types)
    ops = native_render.ops_for(parsed, [p.codec_column for p in plans])
    assert ops is not None
    data, stop = native_render.render_rows(ops, rows, 0, len(rows))
    return data if stop == len(rows) else None


@pytest.mark.parametrize("source_type", TYPES)
def test_every_pool_value_in_every_type_gives_the_python_bytes_or_error(source_type: str) -> None:
    differing = []
    for value in POOL:
        # The value between two good rows, so that a refusal names record 2 in both.
        rows = [(None,), (value,), (None,)]
        expected = written([source_type], rows, native=False)
        got = written([source_type], rows, native=True)
        direct = taken([source_type], [(value,)])
        if got != expected or (direct is not None and direct != expected[1:-1]):
            differing.append((value, expected, got, direct))
    assert not differing, differing[:5]


MUST_TAKE = [
    ("bit", [True, False, 0, 1]),
    ("int", [0, -1, 2**31 - 1]),
    ("bigint", [-(2**63), 2**63 - 1, 10**30]),
    ("decimal(18, 2)", [1234.5, -5165434168404.59, 0.0, -0.0, 7, decimal.Decimal("1.50")]),
    ("decimal(18, 2)", [decimal.Decimal("-0.00"), "1.50", 1e-4, 99999999999999.9]),
    ("float", [0.1, -0.0, 1e16, 1 / 3, 5e-324, math.nan]),
    ("real", [0.10000000149011612, 3.4028234663852886e38, -0.0, 16777216.0]),
    ("date", ["2020-01-02", dt.date(2020, 1, 2), dt.date(1, 1, 1)]),
    ("datetime2(7)", ["2020-01-02 03:04:05.1234567", dt.datetime(2020, 1, 2, 3, 4, 5, 6)]),
    ("datetime", [dt.datetime(2020, 1, 2, 3, 4, 5, 3000), dt.datetime(2020, 1, 2, 3, 4, 5, 1)]),
    ("smalldatetime", [dt.datetime(2020, 1, 2, 3, 4)]),
    ("datetimeoffset(7)", ["2020-01-02 03:04:05.1234567 +05:30"]),
    ("time(7)", ["12:00:00.1234567", dt.time(23, 59, 59, 999999)]),
    ("uniqueidentifier", [GUID, GUID.upper(), uuid.UUID(GUID), uuid.UUID(int=2**128 - 1)]),
    ("nvarchar(10)", [t for t in HOSTILE_TEXT]),
    ("varbinary(max)", list(HOSTILE_BINARY)),
    ("rowversion", [b"\x00" * 7 + b"\x01"]),
]


@pytest.mark.parametrize(("source_type", "values"), MUST_TAKE)
def test_the_common_values_are_taken_by_the_compiled_renderer(
    source_type: str, values: list[Any]
) -> None:
    """Not only the same verdicts: the values drivers hand are the compiled path's."""
    rows = [(v,) for v in values]
    expected = written([source_type], rows, native=False)
    assert isinstance(expected, bytes)
    assert taken([source_type], rows) == expected


def test_a_refused_row_is_named_at_its_record_whatever_renders_the_rows_before() -> None:
    types = ["bigint", "nvarchar(10)", "int"]
    good = [(i, f"n{i}\t", -i) for i in range(1, 2500)]
    for bad in [(1, "x", "1"), (1, "\ud800", 2), (True, "x", 2), ("x", 1, 2)]:
        rows = [*good, bad, *good]
        expected = written(types, rows, native=False)
        assert isinstance(expected, tuple) and expected[2]["record"] == 2500, expected
        assert written(types, rows, native=True) == expected
    narrow = [*good, (1, "x"), *good]
    assert written(types, narrow, native=True) == written(types, narrow, native=False)
    # A declined row that the Python path writes (a bytearray) is written in its place.
    rows = [*good, (1, "x", 2), *good]
    assert written(types, rows, native=True) == written(types, rows, native=False)
    odd = [*good, (bytearray(b"1"), "x", 2)]
    assert written(["varbinary(max)", "text", "int"], odd, native=True) == written(
        ["varbinary(max)", "text", "int"], odd, native=False
    )


def test_render_rows_stops_at_the_first_declined_row_and_resumes_where_asked() -> None:
    types = ["int", "text"]
    rows: list[Any] = [(1, "a"), (2, "b"), (True, "c"), (4, "d"), [5, "e"], (6, "f", 7)]
    parsed, plans = _columns(types)
    ops = native_render.ops_for(parsed, [p.codec_column for p in plans])
    assert ops is not None
    assert native_render.render_rows(ops, rows, 0, 6) == (b"1\ta\n2\tb\n", 2)
    assert native_render.render_rows(ops, rows, 3, 6) == (b"4\td\n", 4)
    assert native_render.render_rows(ops, rows, 1, 2) == (b"2\tb\n", 2)
    assert native_render.render_rows(ops, rows, 5, 6) == (b"", 5)  # a row too wide
    assert native_render.render_rows(ops, rows, 0, 99) == (b"1\ta\n2\tb\n", 2)


def test_without_the_compiled_renderer_the_python_path_writes_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rows = [(1, 2.5, GUID.upper()), (None, None, None)]
    types = ["bigint", "decimal(9, 2)", "uniqueidentifier"]
    expected = written(types, rows, native=True)
    monkeypatch.setattr(native_render, "_MODULE", None)
    parsed, plans = _columns(types)
    assert native_render.ops_for(parsed, [p.codec_column for p in plans]) is None
    assert (
        written(types, rows, native=True) == expected == b"1\t2.5\t" + GUID.encode() + b"\n\t\t\n"
    )


def _binary32(data: bytes) -> float:
    return float(struct.unpack("<f", data)[0])


@settings(max_examples=400)
@given(
    st.lists(
        st.tuples(
            st.integers(min_value=-(2**64), max_value=2**64),
            st.floats(allow_nan=False) | st.decimals(allow_nan=False, places=3),
            st.floats(),
            st.binary(min_size=4, max_size=4).map(_binary32) | st.floats(width=32),
            st.text() | st.none(),
            st.datetimes() | st.text(max_size=30),
            st.uuids() | st.uuids().map(str).map(str.upper),
            st.binary() | st.none(),
            st.times() | st.dates(),
        ),
        max_size=40,
    )
)
@example([(0, -0.0, -0.0, -0.0, "", dt.datetime(1000, 1, 1), uuid.UUID(int=0), b"", dt.time())])
def test_generated_rows_give_the_python_bytes_or_error(rows: list[tuple[Any, ...]]) -> None:
    types = [
        "bigint",
        "decimal(38, 10)",
        "float",
        "real",
        "nvarchar(max)",
        "datetime2(7)",
        "uniqueidentifier",
        "varbinary(max)",
        "time(7)",
    ]
    assert written(types, rows, native=True) == written(types, rows, native=False)


@settings(max_examples=2000)
@given(st.floats(allow_nan=False, allow_infinity=False))
@example(1e-4)
@example(9.999999999999999e-05)
@example(999999999999999.9)
@example(0.30000000000000004)
def test_a_float_renders_as_its_repr_and_its_decimal_rule(value: float) -> None:
    for source_type in ("float", "decimal(38, 10)", "real"):
        rows = [(value,)]
        expected = written([source_type], rows, native=False)
        assert written([source_type], rows, native=True) == expected, (source_type, value)
        direct = taken([source_type], rows)
        assert direct is None or direct == expected
        if source_type == "float":
            assert direct == (repr(value) + "\n").encode()


def test_a_family_the_compiled_renderer_lacks_is_written_by_python(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A family added to the renderer's table without a C operation is declined to the
    Python path (the same bytes), never a ``KeyError``."""
    rows = [(1, "a\tb"), (None, None)]
    types = ["int", "nvarchar(10)"]
    expected = written(types, rows, native=False)
    monkeypatch.delitem(native_render._OPS, "integer")
    parsed, plans = _columns(types)
    assert native_render.ops_for(parsed, [p.codec_column for p in plans]) is None
    assert written(types, rows, native=True) == expected
    assert isinstance(expected, bytes)
    assert expected.startswith(b"1\ta") and expected.endswith(b"\n\t\n")
