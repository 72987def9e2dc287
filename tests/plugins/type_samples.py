"""Sample values and types the type policy, the compiled renderer and the compiled
converter are tested with: exact and refused cells, declared types, Hypothesis cells."""

from __future__ import annotations

import datetime as dt
import decimal
import uuid
from typing import Any

from hypothesis import strategies as st

from dpone.connectors.bulk_text_codec import encode_record
from dpone.typepolicy import ColumnPlan

D = decimal.Decimal


# (source type, canonical text, decoded value)
EXACT = [
    ("bit", "0", False),
    ("bit", "1", True),
    ("tinyint", "0", 0),
    ("tinyint", "255", 255),
    ("smallint", "-32768", -32768),
    ("smallint", "32767", 32767),
    ("int", "-2147483648", -(2**31)),
    ("int", "2147483647", 2**31 - 1),
    ("bigint", "-9223372036854775808", -(2**63)),
    ("bigint", "9223372036854775807", 2**63 - 1),
    ("decimal(9, 0)", "999999999", D("999999999")),
    ("decimal(9, 9)", "-0.999999999", D("-0.999999999")),
    ("decimal(18, 4)", "99999999999999.9999", D("99999999999999.9999")),
    ("decimal(18, 4)", "-1.5", D("-1.5000")),
    ("decimal(18, 4)", "1.50000", D("1.5")),
    ("numeric(38, 0)", "9" * 38, D("9" * 38)),
    ("decimal(38, 38)", "0." + "9" * 38, D("0." + "9" * 38)),
    ("decimal(38, 10)", "-" + "9" * 28 + "." + "9" * 10, D("-" + "9" * 28 + "." + "9" * 10)),
    ("decimal", "123", D(123)),
    ("money", "-922337203685477.5808", D("-922337203685477.5808")),
    ("smallmoney", "214748.3647", D("214748.3647")),
    ("float", "0.1", 0.1),
    ("float", "1.7976931348623157e+308", 1.7976931348623157e308),
    ("float", "5e-324", 5e-324),
    ("float(53)", "-2.5", -2.5),
    ("real", "0.1", 0.10000000149011612),
    ("float(24)", "3.4028235e+38", 3.4028234663852886e38),
    ("real", "1.401298464324817e-45", 1.401298464324817e-45),
    ("date", "1900-01-01", dt.date(1900, 1, 1)),
    ("date", "2299-12-31", dt.date(2299, 12, 31)),
    ("date", "2000-02-29", dt.date(2000, 2, 29)),
    ("datetime", "1900-01-01 00:00:00.000", "1900-01-01 00:00:00.000"),
    ("datetime", "2020-01-02 03:04:05.997", "2020-01-02 03:04:05.997"),
    ("smalldatetime", "2079-06-06 23:59:00", "2079-06-06 23:59:00"),
    ("datetime2(7)", "2299-12-31 23:59:59.9999999", "2299-12-31 23:59:59.9999999"),
    ("datetime2(7)", "1969-12-31 23:59:59.9999999", "1969-12-31 23:59:59.9999999"),
    ("datetime2", "1900-01-01 00:00:00.0000000", "1900-01-01 00:00:00.0000000"),
    (
        "datetimeoffset(7)",
        "2020-01-01 00:30:00.1234567 +05:30",
        ("2019-12-31 19:00:00.1234567", 330),
    ),
    ("datetimeoffset(0)", "1900-01-01 10:00:00 +10:00", ("1900-01-01 00:00:00", 600)),
    ("datetimeoffset(3)", "2299-12-31 14:00:00.000 -09:59", ("2299-12-31 23:59:00.000", -599)),
    ("time(7)", "00:00:00.0000000", "00:00:00.0000000"),
    ("time(7)", "23:59:59.9999999", "23:59:59.9999999"),
    ("time(0)", "12:34:56", "12:34:56"),
    ("time(3)", "12:34:56.7", "12:34:56.700"),
    (
        "uniqueidentifier",
        "6F9619FF-8B86-D011-B42D-00C04FC964FF",
        uuid.UUID("6f9619ff-8b86-d011-b42d-00c04fc964ff"),
    ),
    ("uniqueidentifier", "00000000-0000-0000-0000-000000000000", uuid.UUID(int=0)),
    ("uniqueidentifier", "ffffffff-ffff-ffff-ffff-ffffffffffff", uuid.UUID(int=2**128 - 1)),
]


REFUSED: list[tuple[str, str, str]] = [
    ("tinyint", "256", "value_not_representable"),
    ("tinyint", "-1", "value_not_representable"),
    ("smallint", "32768", "value_not_representable"),
    ("int", "2147483648", "value_not_representable"),
    ("bigint", "9223372036854775808", "value_not_representable"),
    ("int", "-0", "invalid_value"),
    ("int", "01", "invalid_value"),
    ("int", "+1", "invalid_value"),
    ("int", "1.0", "invalid_value"),
    ("int", " 1", "invalid_value"),
    ("bit", "2", "invalid_value"),
    ("bit", "true", "invalid_value"),
    ("decimal(9, 2)", "1.234", "value_not_representable"),  # no rounding
    ("decimal(9, 2)", "10000000.00", "value_not_representable"),
    ("decimal(38, 0)", "1" + "0" * 38, "value_not_representable"),
    ("decimal(9, 2)", "-0.00", "invalid_value"),
    ("decimal(9, 2)", "1e3", "invalid_value"),
    ("decimal(9, 2)", ".5", "invalid_value"),
    ("date", "1899-12-31", "value_not_representable"),
    ("date", "2300-01-01", "value_not_representable"),
    ("date", "0001-01-01", "value_not_representable"),
    ("date", "2021-02-29", "invalid_value"),
    ("date", "2021-1-1", "invalid_value"),
    ("datetime2(7)", "1899-12-31 23:59:59.9999999", "value_not_representable"),
    ("datetime2(7)", "2300-01-01 00:00:00", "value_not_representable"),
    ("datetime2(7)", "2020-01-01T00:00:00", "invalid_value"),
    ("datetime2(7)", "2020-01-01 24:00:00", "invalid_value"),
    ("datetime", "1753-01-01 00:00:00.000", "value_not_representable"),
    ("smalldatetime", "2020-01-01 00:00:30", "invalid_value"),
    ("datetimeoffset(7)", "1900-01-01 00:00:00 +00:01", "value_not_representable"),
    ("datetimeoffset(7)", "2020-01-01 00:00:00 +14:01", "invalid_value"),
    ("datetimeoffset(7)", "2020-01-01 00:00:00", "invalid_value"),
    ("time(7)", "24:00:00", "invalid_value"),
    ("time(2)", "00:00:00.123", "value_not_representable"),
    ("uniqueidentifier", "{6F9619FF-8B86-D011-B42D-00C04FC964FF}", "invalid_value"),
    ("uniqueidentifier", "6F9619FF8B86D011B42D00C04FC964FF", "invalid_value"),
]


TYPES = [
    "bit",
    "tinyint",
    "smallint",
    "int",
    "bigint",
    "decimal(9, 2)",
    "decimal(18, 2)",
    "decimal(38, 10)",
    "numeric(5, 0)",
    "money",
    "smallmoney",
    "float",
    "float(53)",
    "real",
    "float(24)",
    "date",
    "datetime",
    "datetime2(7)",
    "datetime2(3)",
    "smalldatetime",
    "datetimeoffset(7)",
    "time(7)",
    "uniqueidentifier",
    "nvarchar(10)",
    "varchar(max)",
    "char(3)",
    "text",
    "xml",
    "binary(4)",
    "varbinary(max)",
    "image",
    "rowversion",
]


GUID = "6f9619ff-8b86-d011-b42d-00c04fc964ff"


def encode_rows(plans: tuple[ColumnPlan, ...], rows: list[list[Any]]) -> bytes:
    return b"".join(encode_record([p.codec_column for p in plans], row) for row in rows)


# Cells of an nvarchar(max), a varbinary(max) and a bigint column, NULLs included.
texts = st.one_of(
    st.none(), st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=30)
)


binaries = st.one_of(st.none(), st.binary(max_size=20))


bigints = st.integers(-(2**63), 2**63 - 1)
