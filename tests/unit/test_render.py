"""Rendering of driver values (as pymssql/sqlite3 return them) to canonical cells."""

from __future__ import annotations

import datetime as dt
import decimal
import uuid
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from dpone.connectors.bulk_text_codec import encode_record
from dpone.contracts.schema import SourceColumn
from dpone.errors import ConfigurationError, DponeError
from dpone.exporters.render import RenderError, field_for, render_row, renderer_for
from dpone.exporters.sources import open_source, sqlserver_type_text
from dpone.typepolicy import plan_column
from dpone.typepolicy.source_types import parse_source_type

TZ = dt.timezone(dt.timedelta(hours=-5, minutes=-30))

CASES = [
    ("bit", True, "1"),
    ("bit", 0, "0"),
    ("tinyint", 255, "255"),
    ("bigint", -(2**63), "-9223372036854775808"),
    (
        "decimal(38, 10)",
        decimal.Decimal("-12345678901234567890123456.0123456789"),
        "-12345678901234567890123456.0123456789",
    ),
    ("decimal(9, 2)", decimal.Decimal("1E+2"), "100"),
    ("decimal(9, 2)", decimal.Decimal("-0.00"), "0.00"),
    ("money", decimal.Decimal("922337203685477.5807"), "922337203685477.5807"),
    ("float", 0.1, "0.1"),
    ("float", -0.0, "-0.0"),
    ("float", 1e308, "1e+308"),
    ("real", 0.10000000149011612, "0.1"),
    ("float(24)", 3.4028234663852886e38, "3.4028235e+38"),
    ("date", dt.date(1, 1, 1), "0001-01-01"),
    ("datetime2(7)", dt.datetime(2020, 1, 2, 3, 4, 5, 123456), "2020-01-02 03:04:05.1234560"),
    ("datetime2(7)", "2020-01-02 03:04:05.1234567", "2020-01-02 03:04:05.1234567"),
    ("datetime", dt.datetime(2020, 1, 2, 3, 4, 5, 3000), "2020-01-02 03:04:05.003"),
    ("smalldatetime", dt.datetime(2020, 1, 2, 3, 4), "2020-01-02 03:04:00"),
    (
        "datetimeoffset(7)",
        dt.datetime(2020, 1, 2, 3, 4, 5, 7, tzinfo=TZ),
        "2020-01-02 03:04:05.0000070 -05:30",
    ),
    ("time(7)", dt.time(23, 59, 59, 999999), "23:59:59.9999990"),
    (
        "uniqueidentifier",
        uuid.UUID("6F9619FF-8B86-D011-B42D-00C04FC964FF"),
        "6f9619ff-8b86-d011-b42d-00c04fc964ff",
    ),
    ("nvarchar(10)", "ü\t", "ü\t"),
    ("varbinary(max)", bytearray(b"\x00\xff"), b"\x00\xff"),
    ("rowversion", b"\x00" * 7 + b"\x01", b"\x00" * 7 + b"\x01"),
]


@pytest.mark.parametrize(("source_type", "value", "expected"), CASES)
def test_driver_values_render_to_canonical_cells_the_policy_accepts(
    source_type: str, value: object, expected: object
) -> None:
    render = renderer_for(parse_source_type(source_type, column="c"))
    cell = render(value)
    assert cell == expected
    if source_type != "date":  # year 1 is outside ClickHouse's range: refused later, on purpose
        plan_column(SourceColumn("c", source_type, False)).encode(cell)


@pytest.mark.parametrize(
    ("source_type", "value"),
    [
        ("int", True),
        ("int", 1.0),
        ("bit", 2),
        ("decimal(9,2)", float("nan")),
        ("decimal(9,2)", 0.1 + 0.2),
        ("float", "1.0"),
        ("datetime2", dt.datetime(2020, 1, 1, tzinfo=TZ)),
        ("nvarchar(3)", b"x"),
        ("varbinary(3)", "x"),
        ("uniqueidentifier", "not-a-guid"),
    ],
)
def test_values_without_exact_rendering_are_refused(source_type: str, value: object) -> None:
    render = renderer_for(parse_source_type(source_type, column="c"))
    with pytest.raises((RenderError, decimal.InvalidOperation, ValueError)):
        render(value)


def test_render_row_names_the_record_and_column_never_the_value() -> None:
    renderers = [
        renderer_for(parse_source_type(t, column="c")) for t in ("int", "bit", "decimal(9, 2)")
    ]
    assert render_row(renderers, ["a", "b", "d"], (1, None, None), record=1) == ["1", None, None]
    with pytest.raises(RenderError) as caught:
        render_row(renderers, ["a", "b", "d"], (1, 7, None), record=41)
    assert (caught.value.details["record"], caught.value.details["column"]) == (41, "b")
    assert caught.value.message.startswith("record 41, column 'b':")
    assert "7" not in caught.value.message.removeprefix("record 41")
    secret = "s3cr3t-card-4111111111111111"
    with pytest.raises(RenderError) as text_in_int:
        render_row(renderers, ["a", "b", "d"], (secret, 1, None), record=2)
    with pytest.raises(RenderError) as text_in_decimal:  # decimal.InvalidOperation inside
        render_row(renderers, ["a", "b", "d"], (1, 1, secret), record=3)
    for error in (text_in_int.value, text_in_decimal.value):
        assert secret not in str(error) and secret not in repr(error.to_dict())
    assert text_in_decimal.value.details == {"record": 3, "column": "d"}


@pytest.mark.parametrize(
    ("meta", "text"),
    [
        (("decimal", 9, 18, 4), "decimal(18, 4)"),
        (("nvarchar", -1, 0, 0), "nvarchar(max)"),
        (("nvarchar", 100, 0, 0), "nvarchar(50)"),
        (("datetime2", 8, 27, 7), "datetime2(7)"),
        (("float", 8, 53, 0), "float(53)"),
        (("real", 4, 24, 0), "real"),
        (("binary", 16, 0, 0), "binary(16)"),
    ],
)
def test_sqlserver_catalog_metadata_to_type_text(
    meta: tuple[str, int, int, int], text: str
) -> None:
    assert sqlserver_type_text(*meta) == text


def test_dsn_rules() -> None:
    with pytest.raises(ConfigurationError) as creds:
        open_source("mssql://sa:secret@host/db")
    assert creds.value.code == "credentials_in_dsn" and "secret" not in str(creds.value)
    with pytest.raises(ConfigurationError) as scheme:
        open_source("oracle://x/y")
    assert scheme.value.code == "invalid_dsn"
    source = open_source("mssql://db.example:1444/sales")
    assert (source.host, source.port, source.database) == ("db.example", 1444, "sales")  # type: ignore[attr-defined]


FUSED_EXTRA = [
    ("int", 7),
    ("int", True),
    ("int", 1.0),
    ("bigint", -(2**63)),
    ("float", 5),
    ("float", True),
    ("float", float("inf")),
    ("float", "1.0"),
    ("uniqueidentifier", "6f9619ff-8b86-d011-b42d-00c04fc964ff"),
    ("uniqueidentifier", "6F9619FF-8B86-D011-B42D-00C04FC964FF"),
    ("uniqueidentifier", "not-a-guid"),
    ("nvarchar(10)", ""),
    ("nvarchar(10)", "a\x1db\tc\nd\re\x1ef\x1fg"),
    ("nvarchar(10)", "\ud800"),
    ("nvarchar(10)", b"x"),
    ("varbinary(3)", b""),
    ("varbinary(3)", b"\x00\x1d"),
    ("varbinary(3)", "x"),
    ("varbinary(3)", memoryview(b"ab")),
    ("decimal(9, 2)", "1.50"),
    ("decimal(9, 2)", 0.1 + 0.2),
    ("date", "2020-01-01\t"),
    ("time(7)", "12:00:00\n"),
    ("datetime2(7)", ""),
]


@pytest.mark.parametrize(("source_type", "value"), [(t, v) for t, v, _ in CASES] + FUSED_EXTRA)
def test_a_fused_field_equals_render_then_encode_or_refuses(
    source_type: str, value: object
) -> None:
    """The export's one-step path gives exactly the careful path's field, or hands over."""
    st = parse_source_type(source_type, column="c")
    column = plan_column(SourceColumn("c", source_type, True)).codec_column
    try:
        careful: bytes | None = encode_record(
            [column], render_row([renderer_for(st)], ["c"], (value,), record=1)
        )
    except DponeError:
        careful = None
    try:
        fused: bytes | None = (field_for(st, column)(value) + "\n").encode("utf-8")
    except Exception:  # any exception hands the row to the careful path
        fused = None
    if fused is not None:
        assert fused == careful, (source_type, value)
    if (source_type, value) in MUST_FUSE:  # the common values do take the one-step path
        assert fused is not None and careful is not None, (source_type, value)


MUST_FUSE = [
    ("int", 7),
    ("bigint", -(2**63)),
    ("float", 0.1),
    ("float", -0.0),
    ("nvarchar(10)", ""),
    ("nvarchar(10)", "a\x1db\tc\nd\re\x1ef\x1fg"),
    ("varbinary(3)", b""),
    ("varbinary(3)", b"\x00\x1d"),
    ("uniqueidentifier", "6f9619ff-8b86-d011-b42d-00c04fc964ff"),
    ("decimal(9, 2)", "1.50"),
    ("datetime2(7)", "2020-01-02 03:04:05.1234567"),
    ("uniqueidentifier", "6F9619FF-8B86-D011-B42D-00C04FC964FF"),
    ("decimal(18, 2)", 1234.5),
]


def _decimal_of_float_by_decimal(value: float) -> str | None:
    """The float rule stated with Decimal (the oracle of the plain-text shortcut)."""
    text = repr(value)
    if len(decimal.Decimal(text).as_tuple().digits) > 15:
        return None
    exact = decimal.Decimal(text)
    out = format(exact, "f")
    return out[1:] if out.startswith("-") and not exact else out


@given(st.floats(allow_nan=False, allow_infinity=False))
@example(-0.0)
@example(0.0)
@example(1e16)
@example(1e-5)
@example(123456789012345.6)
@example(0.001234567890123456)
def test_a_float_decimal_renders_as_the_decimal_rule_says(value: float) -> None:
    render = renderer_for(parse_source_type("decimal(38, 10)", column="c"))
    try:
        got: object = render(value)
    except RenderError:
        got = None
    assert got == _decimal_of_float_by_decimal(value)


@given(st.uuids(), st.sampled_from([str.lower, str.upper, str.swapcase]))
def test_a_guid_in_any_case_renders_as_uuid_does(value: uuid.UUID, case: Any) -> None:
    text = case(str(value))
    st_guid = parse_source_type("uniqueidentifier", column="c")
    column = plan_column(SourceColumn("c", "uniqueidentifier", True)).codec_column
    assert renderer_for(st_guid)(text) == str(uuid.UUID(text)) == field_for(st_guid, column)(text)
