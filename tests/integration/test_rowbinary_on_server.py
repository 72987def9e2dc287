"""Value reconciliation on the real server: prepared RowBinary read back as text and typed."""

from __future__ import annotations

import decimal
import json
from typing import Any

import pytest

from dpone.contracts.schema import SourceColumn
from dpone.localserver import ServerInfo
from dpone.typepolicy import plan_column
from tests import chhttp

DB = "rb_reconcile"

# source type -> [(canonical text or bytes, expected toString() on the server)]
CASES: dict[str, list[tuple[Any, str]]] = {
    "bit": [("0", "false"), ("1", "true")],
    "tinyint": [("0", "0"), ("255", "255")],
    "smallint": [("-32768", "-32768"), ("32767", "32767")],
    "int": [("-2147483648", "-2147483648"), ("2147483647", "2147483647")],
    "bigint": [
        ("-9223372036854775808", "-9223372036854775808"),
        ("9223372036854775807", "9223372036854775807"),
    ],
    "decimal(9, 9)": [("-0.999999999", "-0.999999999"), ("0.000000001", "0.000000001")],
    "decimal(18, 4)": [
        ("99999999999999.9999", "99999999999999.9999"),
        ("-1.5", "-1.5"),
        ("0", "0"),
    ],
    "decimal(38, 10)": [("-" + "9" * 28 + "." + "9" * 10, "-" + "9" * 28 + "." + "9" * 10)],
    "numeric(38, 0)": [("9" * 38, "9" * 38)],
    "money": [("-922337203685477.5808", "-922337203685477.5808")],
    "smallmoney": [("214748.3647", "214748.3647")],
    "float": [
        ("0.1", "0.1"),
        ("-0.0", "-0"),
        ("1.7976931348623157e+308", "1.7976931348623157e308"),
        ("5e-324", "5e-324"),
    ],
    "real": [("0.1", "0.1"), ("3.4028235e+38", "3.4028235e38"), ("-0.0", "-0")],
    "date": [
        ("1900-01-01", "1900-01-01"),
        ("2299-12-31", "2299-12-31"),
        ("1970-01-01", "1970-01-01"),
    ],
    "datetime": [("2020-01-02 03:04:05.997", "2020-01-02 03:04:05.997")],
    "smalldatetime": [
        ("1900-01-01 00:00:00", "1900-01-01 00:00:00"),
        ("2079-06-06 23:59:00", "2079-06-06 23:59:00"),
    ],
    "datetime2(0)": [("1969-12-31 23:59:59", "1969-12-31 23:59:59")],
    "datetime2(3)": [("2000-01-01 00:00:00.001", "2000-01-01 00:00:00.001")],
    "datetime2(7)": [
        ("2299-12-31 23:59:59.9999999", "2299-12-31 23:59:59.9999999"),
        ("1900-01-01 00:00:00.0000000", "1900-01-01 00:00:00.0000000"),
        ("1969-12-31 23:59:59.9999999", "1969-12-31 23:59:59.9999999"),
    ],
    "datetimeoffset(7)": [
        ("2020-01-01 00:30:00.1234567 +05:30", "('2019-12-31 19:00:00.1234567',330)")
    ],
    "time(7)": [("00:00:00.0000000", "00:00:00.0000000"), ("23:59:59.9999999", "23:59:59.9999999")],
    "time(0)": [("12:34:56", "12:34:56")],
    "uniqueidentifier": [
        ("6F9619FF-8B86-D011-B42D-00C04FC964FF", "6f9619ff-8b86-d011-b42d-00c04fc964ff")
    ],
    "nvarchar(max)": [
        ("", ""),
        ("NULL", "NULL"),
        ("é😀\t\n\x1d", "é😀\t\n\x1d"),
        ("x" * 16384, "x" * 16384),
    ],
    "varbinary(max)": [(b"", ""), (bytes(range(256)), bytes(range(256)).hex().upper())],
    "rowversion": [(b"\x00" * 7 + b"\x01", "0000000000000001")],
}

HEX_RESULT = {"varbinary(max)", "rowversion"}


def _table(source_type: str) -> str:
    return "t_" + "".join(ch if ch.isalnum() else "_" for ch in source_type)


@pytest.mark.parametrize("source_type", list(CASES))
def test_prepared_values_read_back_exactly(clickhouse: ServerInfo, source_type: str) -> None:
    port = clickhouse.http_port
    chhttp.query(port, f"CREATE DATABASE IF NOT EXISTS {DB} ENGINE = Atomic")
    ordinal = plan_column(SourceColumn("ord", "int", False))
    value = plan_column(SourceColumn("v", source_type, True))
    table = f"{DB}.{_table(source_type)}"
    chhttp.query(
        port,
        f"CREATE TABLE {table} (ord Int32, v {value.clickhouse_type}) ENGINE = MergeTree ORDER BY ord",
    )
    cells = [c for c, _ in CASES[source_type]] + [None]
    payload = b"".join(ordinal.encode(str(i)) + value.encode(c) for i, c in enumerate(cells))
    chhttp.query(port, f"INSERT INTO {table} FORMAT RowBinary", data=payload)

    expression = "hex(v)" if source_type in HEX_RESULT else "toString(v)"
    got = chhttp.rows(
        port, f"SELECT ord, isNull(v) AS n, {expression} AS s FROM {table} ORDER BY ord"
    )
    expected = [{"ord": i, "n": 0, "s": s} for i, (_, s) in enumerate(CASES[source_type])]
    expected.append({"ord": len(cells) - 1, "n": 1, "s": None})
    assert got == expected
    assert chhttp.rows(port, f"SELECT toTypeName(v) AS t FROM {table} LIMIT 1") == [
        {"t": value.clickhouse_type}
    ]


def test_typed_values_read_back_as_json(clickhouse: ServerInfo) -> None:
    port = clickhouse.http_port
    chhttp.query(port, f"CREATE DATABASE IF NOT EXISTS {DB} ENGINE = Atomic")
    columns = [
        ("i", "bigint", "-9223372036854775808"),
        ("d", "decimal(38, 10)", "-1234567890123456789012345678.0123456789"),
        ("f", "float", "0.1"),
        ("r", "real", "0.1"),
        ("b", "bit", "1"),
        ("t", "datetime2(7)", "2020-01-02 03:04:05.1234567"),
    ]
    plans = [plan_column(SourceColumn(n, t, False)) for n, t, _ in columns]
    ddl = ", ".join(f"{p.name} {p.clickhouse_type}" for p in plans)
    chhttp.query(port, f"CREATE TABLE {DB}.typed ({ddl}) ENGINE = MergeTree ORDER BY tuple()")
    chhttp.query(
        port,
        f"INSERT INTO {DB}.typed FORMAT RowBinary",
        data=b"".join(p.encode(v) for p, (_, _, v) in zip(plans, columns, strict=True)),
    )
    text = chhttp.query(
        port,
        f"SELECT i, d, f, r, b, toUnixTimestamp64Nano(t) AS t_ns FROM {DB}.typed "
        "SETTINGS output_format_json_quote_64bit_integers = 0, output_format_json_quote_decimals = 0 "
        "FORMAT JSONEachRow",
    )
    row = json.loads(text, parse_float=decimal.Decimal)
    assert row["i"] == -(2**63)
    assert row["d"] == decimal.Decimal("-1234567890123456789012345678.0123456789")
    assert float(row["f"]) == 0.1
    assert float(row["r"]) == 0.10000000149011612 or row["r"] == decimal.Decimal("0.1")
    assert row["b"] is True
    assert row["t_ns"] == 1577934245123456700
