"""The type policy: every type at its edges, checked by an independent RowBinary decoder."""

from __future__ import annotations

import math
from typing import Any

import pytest

from dpone.contracts.schema import SourceColumn
from dpone.errors import PolicyError
from dpone.typepolicy import Refused, plan_column
from tests.oracles.rowbinary_oracle import decode_rows
from tests.plugins.type_samples import EXACT, REFUSED, D


def roundtrip(
    source_type: str, cell: Any, *, nullable: bool = False, override: str | None = None
) -> Any:
    plan = plan_column(SourceColumn("c", source_type, nullable), override)
    data = plan.encode(cell)
    [(value,)] = decode_rows(data, [plan.clickhouse_type], rows=1)
    return value


def refused(source_type: str, cell: Any, override: str | None = None) -> Refused:
    plan = plan_column(SourceColumn("c", source_type, False), override)
    with pytest.raises(Refused) as caught:
        plan.encode(cell)
    return caught.value


@pytest.mark.parametrize(("source_type", "text", "expected"), EXACT)
def test_exact_values_at_the_edges(source_type: str, text: str, expected: Any) -> None:
    assert roundtrip(source_type, text) == expected
    assert roundtrip(source_type, text, nullable=True) == expected
    assert roundtrip(source_type, None, nullable=True) is None


@pytest.mark.parametrize("p", range(8))
def test_every_datetime2_and_time_precision(p: int) -> None:
    frac = "1234567"[:p]
    text = "2024-05-06 07:08:09" + (f".{frac}" if p else "")
    assert roundtrip(f"datetime2({p})", text) == text
    assert roundtrip(f"time({p})", text[11:]) == text[11:]
    assert roundtrip(f"datetime2({p})", "2024-05-06 07:08:09.0000000") == "2024-05-06 07:08:09" + (
        "." + "0" * p if p else ""
    )
    if p < 7:
        assert (
            refused(f"datetime2({p})", "2024-05-06 07:08:09." + "0" * p + "1").code
            == "value_not_representable"
        )


def test_float_specials() -> None:
    negative_zero = roundtrip("float", "-0.0")
    assert negative_zero == 0 and math.copysign(1, negative_zero) == -1
    assert math.copysign(1, roundtrip("real", "-0.0")) == -1
    for text in ("NaN", "nan", "inf", "-Infinity", "1e999", " 1", "1_0", "+1", ".5", "1."):
        assert refused("float", text).code in ("invalid_value", "value_not_representable")
    assert refused("real", "1e39").code == "value_not_representable"
    assert (
        refused("real", "36e7122").code == "value_not_representable"
    )  # found by the engine differential test
    assert refused("real", "0.1000000001").code == "value_not_representable"  # would round


@pytest.mark.parametrize(("source_type", "text", "code"), REFUSED)
def test_refused_values(source_type: str, text: str, code: str) -> None:
    assert refused(source_type, text).code == code


@pytest.mark.parametrize("length", [0, 1, 127, 128, 16383, 16384, 2**21])
def test_strings_and_binary_at_leb128_boundaries(length: int) -> None:
    assert (
        roundtrip("nvarchar(max)", "é" * (length // 2) + "x" * (length % 2))
        == ("é" * (length // 2) + "x" * (length % 2)).encode()
    )
    assert roundtrip("varbinary(max)", b"\xab" * length) == b"\xab" * length


def test_binary_with_all_byte_values_and_text_with_controls() -> None:
    everything = bytes(range(256))
    assert roundtrip("varbinary(256)", everything) == everything
    assert roundtrip("image", everything, nullable=True) == everything
    text = "".join(chr(c) for c in range(1, 0x80)) + "é😀"
    assert roundtrip("ntext", text) == text.encode()
    assert roundtrip("rowversion", b"\x00" * 7 + b"\x01") == b"\x00" * 7 + b"\x01"
    assert refused("rowversion", b"\x01" * 9).code == "value_not_representable"


def test_not_null_columns_refuse_null() -> None:
    assert refused("int", None).code == "null_not_allowed"


@pytest.mark.parametrize(
    ("source_type", "override", "cell", "expected", "ch_type"),
    [
        ("nvarchar(20)", "LowCardinality(String)", "x", b"x", "LowCardinality(String)"),
        ("char(3)", "FixedString(3)", "abc", b"abc", "FixedString(3)"),
        ("nchar(2)", "FixedString(4)", "éé", "éé".encode(), "FixedString(4)"),
        ("binary(4)", "FixedString(4)", b"\x00\x01\x02\x03", b"\x00\x01\x02\x03", "FixedString(4)"),
        ("decimal(9, 2)", "Decimal(38, 4)", "-1234567.89", D("-1234567.89"), "Decimal(38, 4)"),
        ("int", "Int64", "-5", -5, "Int64"),
        ("tinyint", "Int16", "255", 255, "Int16"),
        ("real", "Float64", "0.5", 0.5, "Float64"),
        (
            "datetime2(3)",
            "DateTime64(7, 'UTC')",
            "2020-01-01 00:00:00.123",
            "2020-01-01 00:00:00.1230000",
            "DateTime64(7, 'UTC')",
        ),
    ],
)
def test_overrides_within_family(
    source_type: str, override: str, cell: Any, expected: Any, ch_type: str
) -> None:
    assert plan_column(SourceColumn("c", source_type, False), override).clickhouse_type == ch_type
    assert roundtrip(source_type, cell, override=override) == expected


def test_nullable_low_cardinality_nests_the_right_way() -> None:
    plan = plan_column(SourceColumn("c", "varchar(5)", True), "LowCardinality(String)")
    assert plan.clickhouse_type == "LowCardinality(Nullable(String))"


def test_fixed_string_length_is_exact() -> None:
    assert refused("char(3)", "ab", "FixedString(3)").code == "value_not_representable"
    assert refused("nchar(3)", "abé", "FixedString(3)").code == "value_not_representable"


@pytest.mark.parametrize(
    ("source_type", "override"),
    [
        ("nvarchar(20)", "FixedString(20)"),
        ("int", "Int16"),
        ("int", "UInt32"),
        ("bigint", "UInt64"),
        ("decimal(18, 4)", "Decimal(18, 2)"),
        ("decimal(18, 4)", "Decimal(19, 6)"),
        ("float", "Float32"),
        ("datetime2(7)", "DateTime64(3, 'UTC')"),
        ("int", "String"),
        ("date", "DateTime64(0, 'UTC')"),
        ("nvarchar(5)", "Array(String)"),
        ("uniqueidentifier", "String"),
    ],
)
def test_overrides_outside_family_are_refused(source_type: str, override: str) -> None:
    with pytest.raises(PolicyError) as caught:
        plan_column(SourceColumn("col_x", source_type, False), override)
    assert caught.value.code == "override_not_allowed"
    assert caught.value.details["column"] == "col_x" and "col_x" in str(caught.value)


@pytest.mark.parametrize(
    "source_type",
    [
        "geography",
        "hierarchyid",
        "sql_variant",
        "decimal(39, 0)",
        "decimal(5, 6)",
        "datetime2(8)",
        "float(54)",
        "int(4)",
        "varchar(abc)",
        "money(2)",
        "",
    ],
)
def test_types_outside_the_table_are_refused_by_name(source_type: str) -> None:
    with pytest.raises(PolicyError) as caught:
        plan_column(SourceColumn("the_col", source_type, True))
    assert caught.value.code in ("unsupported_type", "invalid_source_type")
    assert caught.value.details["column"] == "the_col"
