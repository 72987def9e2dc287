"""The compiled converter against the Python reference: what it takes, it takes exactly.

It may decline anything (the reference then decides), but it must never accept a
value the reference refuses, and what it accepts must give the reference's bytes and
rows digest. It must also take the canonical text exporters write, or it would be no
faster than the reference it declines to.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import io
import math
import shutil
import struct
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpone.connectors.bulk_text_codec import BulkTextReader
from dpone.contracts.preparation import ROWS_DIGEST_MODULUS, rows_digest
from dpone.contracts.schema import SourceColumn, SourceSchema
from dpone.errors import DponeError
from dpone.exporters.export import export_table
from dpone.exporters.sources import SqliteSource
from dpone.preparation import file_validation, native_conversion
from dpone.preparation import spool as preparation
from dpone.preparation.conversion import convert_records
from dpone.preparation.file_validation import validate_file
from dpone.preparation.native import rowbinary
from dpone.preparation.native_conversion import MODE_NATIVE
from dpone.preparation.spool import MODE_PYTHON, prepare_rowbinary
from dpone.typepolicy import ColumnPlan, plan_column, plan_columns
from dpone.typepolicy.converters import shortest_float32
from tests.hostile_values import HOSTILE_BINARY, HOSTILE_TEXT
from tests.plugins.staging import make_hostile_db
from tests.plugins.type_samples import EXACT, REFUSED, bigints, binaries, encode_rows, texts


def reference(plans: tuple[ColumnPlan, ...], data: bytes) -> tuple[bytes, str] | None:
    """The reference's spool bytes and the rows digest of its rows, split by the converter."""
    rows: list[bytes] = []
    try:
        convert_records(
            BulkTextReader(io.BytesIO(data), [p.codec_column for p in plans]), plans, rows.append
        )
    except DponeError:
        return None
    return b"".join(rows), rows_digest(rows)


EXTRA_FIELDS = [
    ("nvarchar(5)", b"a\x1dX"),
    ("nvarchar(5)", b"a\x1d"),
    ("nvarchar(5)", b"\x1dEa"),
    ("nvarchar(5)", b"a\rb"),
    ("nvarchar(5)", b"\xff"),
    ("nvarchar(5)", b"\x1dE"),
    # The empty marker where the fixed width needs bytes: the reference refuses it.
    ("nchar(2)", b"\x1dE"),
    ("binary(3)", b"\x1dE"),
    ("nvarchar(5)", b"a\x1ePb"),
    ("varbinary(5)", b" ab"),
    ("varbinary(5)", b"ab "),
    ("varbinary(5)", b"a b"),
    ("varbinary(5)", b"ab cd"),
    ("varbinary(5)", b"abc"),
    ("varbinary(5)", b"\x1dE"),
    ("int", b"1\x1d"),
    ("int", b"\x1dE"),
    ("bigint", b"9223372036854775807"),
    ("decimal(38, 0)", b"-" + b"9" * 38),
    ("decimal(5, 2)", b"123.450"),
    ("decimal(5, 2)", b"1234.5"),
    ("real", b"3.4028236e38"),
    ("real", b"1e-46"),
    ("float", b"1e-400"),
    ("datetimeoffset(3)", b"2020-01-01 00:00:00 +14:00"),
    ("datetimeoffset(3)", b"2020-01-01 00:00:00  +01:00"),
    ("time(7)", b"23:59:59.99999999"),
    ("date", b"2000-02-30"),
]


numbers = st.one_of(
    st.integers(-(2**63), 2**63 - 1).map(str),
    st.decimals(min_value=-(10**12), max_value=10**12, places=4, allow_nan=False).map(
        lambda d: format(d, "f")
    ),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.floats(width=32, allow_nan=False, allow_infinity=False).map(repr),
    st.text(alphabet="0123456789-.eE+ ", max_size=12),
)


def native(plans: tuple[ColumnPlan, ...], data: bytes) -> tuple[bytes, str] | None:
    """The compiled converter's bytes and rows digest; None when it declines."""
    spec = rowbinary.column_spec(plans)
    assert spec is not None, [p.clickhouse_type for p in plans]
    part = rowbinary.convert_range(spec, data)
    if part is None:
        return None
    assert part.rows == data.count(b"\n")
    return part.data, format(part.rows_digest % ROWS_DIGEST_MODULUS, "032x")


def field_verdicts(cases: list[tuple[str, bool, bytes]], override: str | None = None) -> None:
    """Each single field: declined, or accepted with the reference's bytes (which must
    then accept it)."""
    for source_type, nullable, field in cases:
        plans = (plan_column(SourceColumn("c", source_type, nullable), override),)
        ours = native(plans, field + b"\n")
        if ours is not None:
            assert ours == reference(plans, field + b"\n"), (source_type, nullable, field)


def test_the_library_is_built_and_runs() -> None:
    # The test command builds it (scripts/bootstrap.sh): a missing library is a failure
    # here, never a silent fall back to the reference.
    assert rowbinary.available()
    assert rowbinary.LIBRARY.is_file()


def test_every_edge_value_of_every_type_is_taken_with_identical_bytes() -> None:
    for source_type, text, _ in EXACT:
        for nullable in (False, True):
            plans = (plan_column(SourceColumn("c", source_type, nullable)),)
            data = text.encode() + b"\n" + (b"\n" if nullable else b"")
            expected = reference(plans, data)
            assert expected is not None
            assert native(plans, data) == expected, (source_type, text)


def test_every_precision_of_datetime2_and_time_is_taken() -> None:
    for p in range(8):
        frac = "1234567"[:p]
        stamp = "2024-05-06 07:08:09" + (f".{frac}" if p else "")
        padded = "2024-05-06 07:08:09.0000000"
        plans = plan_columns(
            [
                SourceColumn("d", f"datetime2({p})", False),
                SourceColumn("t", f"time({p})", False),
                SourceColumn("o", f"datetimeoffset({p})", False),
            ]
        )
        data = encode_rows(
            plans,
            [[stamp, stamp[11:], stamp + " -03:30"], [padded, padded[11:], padded + " +14:00"]],
        )
        assert native(plans, data) == reference(plans, data) is not None


def test_hostile_text_and_binary_are_taken_with_identical_bytes() -> None:
    plans = plan_columns(
        [
            SourceColumn("t", "nvarchar(max)", True),
            SourceColumn("b", "varbinary(max)", True),
            SourceColumn("f", "char(3)", False),
            SourceColumn("l", "nvarchar(9)", True),
            SourceColumn("x", "binary(2)", True),
        ],
        {"f": "FixedString(3)", "l": "LowCardinality(String)", "x": "FixedString(2)"},
    )
    rows: list[list[Any]] = [[t, None, "abc", t, None] for t in HOSTILE_TEXT]
    rows += [[None, b, "xyz", None, b"\x00\xff"] for b in HOSTILE_BINARY]
    rows += [[None, None, "é\t", "", b"\x1d\n"]]  # escapes count as one byte of the fixed width
    data = encode_rows(plans, rows) + b"\\N\tab CD\x0b01\rFF\tabc\t\t0a \x0c0B\n"
    expected = reference(plans, data)
    assert expected is not None
    assert native(plans, data) == expected


def test_refused_values_are_never_taken() -> None:
    cases: list[tuple[str, bool, bytes]] = []
    for source_type, text, _ in REFUSED:
        cases += [(source_type, False, text.encode()), (source_type, True, text.encode())]
    for source_type, field in EXTRA_FIELDS:
        cases += [
            (source_type, False, field),
            (source_type, True, field),
            (source_type, False, b""),
        ]
    for source_type, nullable, field in cases:
        plans = (plan_column(SourceColumn("c", source_type, nullable)),)
        if reference(plans, field + b"\n") is None:
            assert native(plans, field + b"\n") is None, (source_type, nullable, field)
    field_verdicts(cases)


# Fields the reference refuses for a reason of the format, not of the value.
FORMAT_FAULTS = [
    ("nvarchar(5)", b"a\x1d"),
    ("nvarchar(5)", b"\x1d"),
    ("nvarchar(5)", b"\x1dEa"),
    ("nvarchar(5)", b"a\x1dE"),
    ("nvarchar(5)", b"a\x1dX"),
    ("nvarchar(5)", b"a\x1d\xc3\xa9"),
    ("nvarchar(5)", b"a\rb"),
    ("nvarchar(5)", b"\x1e"),
    ("nvarchar(5)", b"\x1f"),
    ("nvarchar(5)", b"\xc0\x80"),
    ("nvarchar(5)", b"\xed\xa0\x80"),
    ("nvarchar(5)", b"\xf4\x90\x80\x80"),
    ("nvarchar(5)", b"\xe0\x80\x80"),
    ("nvarchar(5)", b"\xf0\x80\x80\x80"),
    ("nvarchar(5)", b"\xc3"),
    ("nvarchar(5)", b"\xff"),
    ("nvarchar(5)", b"\x80"),
    ("varbinary(5)", b"a"),
    ("varbinary(5)", b" ab"),
    ("varbinary(5)", b"ab "),
    ("varbinary(5)", b"ab\tcd"),
    ("varbinary(5)", b"ab\x00cd"),
    ("varbinary(5)", b"abc d"),
    ("varbinary(5)", b"gg"),
    ("varbinary(5)", b"\x1dEab"),
    ("varbinary(5)", b"\x1d"),
    ("int", b"1\x1d"),
    ("int", b"1\r"),
    ("int", b"\xd9\xa1"),
    ("date", b"2020-01-01\x1e"),
    ("float", b"\xef\xbc\x91"),
]


def test_format_faults_are_never_taken() -> None:
    for source_type, field in FORMAT_FAULTS:
        for nullable in (False, True):
            plans = (plan_column(SourceColumn("c", source_type, nullable)),)
            assert reference(plans, field + b"\n") is None, field
            assert native(plans, field + b"\n") is None, (source_type, field)


def test_records_of_the_wrong_width_and_nulls_in_not_null_columns_are_declined() -> None:
    plans = plan_columns([SourceColumn("a", "int", False), SourceColumn("b", "nvarchar(5)", False)])
    for data in (b"1\n", b"1\tx\ty\n", b"\tx\n", b"1\t\n", b"1\tx\n1\n", b"\n"):
        assert reference(plans, data) is None
        assert native(plans, data) is None, data
    assert native(plans, b"") == (b"", "0" * 32) == reference(plans, b"")


@settings(max_examples=20, deadline=None)
@given(st.lists(numbers, min_size=50, max_size=50))
def test_random_numbers_agree(values: list[str]) -> None:
    types = [
        "int",
        "bigint",
        "tinyint",
        "decimal(18, 4)",
        "decimal(38, 10)",
        "decimal(9, 9)",
        "float",
        "real",
        "smallmoney",
        "bit",
    ]
    field_verdicts([(t, True, v.encode()) for t in types for v in values])


FLOAT32_TIES = [
    "0.5",
    "2.5",
    "1.5",
    "0.125",
    "3.4028235e38",
    "3.4028234e38",
    "1.17549435e-38",
    "1e-45",
    "1.4e-45",
    "7e-46",
    "0.1",
    "16777217",
    "16777216",
    "0.30000001",
    "1e10",
]


@settings(max_examples=20, deadline=None)
@given(
    st.lists(st.floats(width=32, allow_nan=False, allow_infinity=False), min_size=100, max_size=100)
)
def test_float32_shortest_texts_are_taken_and_others_agree(values: list[float]) -> None:
    plans = (plan_column(SourceColumn("c", "real", False)),)
    for value in values:
        text = shortest_float32(value).encode()  # what the exporter writes: taken
        assert native(plans, text + b"\n") == reference(plans, text + b"\n") is not None, text
        for other in (repr(value), f"{value:.8g}", f"{value:.6g}", f"{value * 1.0000001!r}"):
            field_verdicts([("real", False, other.encode())])
    field_verdicts([("real", False, t.encode()) for t in FLOAT32_TIES])


@settings(max_examples=20, deadline=None)
@given(st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=100, max_size=100))
def test_float64_texts_are_taken_with_the_exact_parse(values: list[float]) -> None:
    plans = (plan_column(SourceColumn("c", "float", False)),)
    for value in values:
        for text in (repr(value), f"{value:.25g}", f"{value:.3e}", f"{value:.17f}".rstrip("0")):
            data = text.encode() + b"\n"
            ours = native(plans, data)
            assert ours == reference(plans, data), text
            if math.isfinite(float(text)) and "inf" not in text and not text.endswith("."):
                assert ours is not None, text  # any text of the grammar is taken


def _stamp_text(stamp: dt.datetime, digits: int) -> str:
    return stamp.strftime("%Y-%m-%d %H:%M:%S") + (
        f".{stamp.microsecond:06d}0"[: digits + 1] if digits else ""
    )


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            texts,
            binaries,
            bigints,
            st.one_of(
                st.none(),
                st.decimals(min_value=-(10**13), max_value=10**13, places=4, allow_nan=False),
            ),
            st.datetimes(min_value=dt.datetime(1900, 1, 1), max_value=dt.datetime(2299, 12, 31)),
            st.one_of(st.none(), st.uuids()),
            st.one_of(
                st.none(), st.dates(min_value=dt.date(1900, 1, 1), max_value=dt.date(2299, 12, 31))
            ),
            st.integers(-14 * 60, 14 * 60),
        ),
        max_size=60,
    )
)
def test_random_canonical_rows_are_taken_with_identical_bytes(rows: list[Any]) -> None:
    plans = plan_columns(
        [
            SourceColumn("t", "nvarchar(max)", True),
            SourceColumn("b", "varbinary(max)", True),
            SourceColumn("i", "bigint", False),
            SourceColumn("d", "decimal(18, 4)", True),
            SourceColumn("s", "datetime2(7)", False),
            SourceColumn("g", "uniqueidentifier", True),
            SourceColumn("day", "date", True),
            SourceColumn("o", "datetimeoffset(6)", False),
        ]
    )
    cells = []
    for t, b, i, d, s, g, day, offset in rows:
        sign = "-" if offset < 0 else "+"
        zone = f"{sign}{abs(offset) // 60:02d}:{abs(offset) % 60:02d}"
        # An instant near the range's ends may leave it once the offset applies.
        local = min(max(s, dt.datetime(1900, 1, 2)), dt.datetime(2299, 12, 30))
        cells.append(
            [
                t,
                b,
                str(i),
                None if d is None else format(d, "f"),
                _stamp_text(s, 7),
                None if g is None else str(g),
                None if day is None else day.isoformat(),
                f"{_stamp_text(local, 6)} {zone}",
            ]
        )
    data = encode_rows(plans, cells)
    expected = reference(plans, data)
    assert expected is not None
    assert native(plans, data) == expected


def test_columns_it_does_not_take_are_left_to_the_reference() -> None:
    assert (
        rowbinary.column_spec(plan_columns([SourceColumn("d", "decimal(38, 2)", False)]))
        is not None
    )
    wide = plan_columns([SourceColumn("d", "decimal(38, 2)", False)], {"d": "Decimal(76, 40)"})
    nanos = plan_columns([SourceColumn("t", "datetime2(7)", False)], {"t": "DateTime64(9, 'UTC')"})
    assert rowbinary.column_spec(wide) is None and rowbinary.column_spec(nanos) is None
    assert not native_conversion.takes(wide)


def test_conversions_on_parallel_threads_are_independent() -> None:
    plans = plan_columns(
        [
            SourceColumn("f", "float", True),
            SourceColumn("r", "real", True),
            SourceColumn("t", "nvarchar(20)", True),
        ]
    )
    files = [
        encode_rows(
            plans,
            [
                [
                    repr(i / 7),
                    shortest_float32(struct.unpack("<f", struct.pack("<f", i / 3))[0]),
                    f"v{i}\t{k}",
                ]
                for i in range(k * 500, k * 500 + 2000)
            ],
        )
        for k in range(8)
    ]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda data: native(plans, data), files * 3))
    assert results == [reference(plans, data) for data in files * 3]


# ----------------------------------------------------------------------------- through preparation and validation


def _tiny_ranges(monkeypatch: pytest.MonkeyPatch, size: int) -> None:
    monkeypatch.setattr(native_conversion, "MIN_RANGE_BYTES", size)
    monkeypatch.setattr(native_conversion, "MAX_RANGE_BYTES", size)


def _no_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_reference(*args: object, **kwargs: object) -> int:
        raise AssertionError("the compiled converter handed a valid file on")

    monkeypatch.setattr(preparation, "convert_records", no_reference)
    monkeypatch.setattr(file_validation, "convert_records", no_reference)


@pytest.mark.parametrize("range_bytes", [1, 97, 1 << 20])
def test_native_mode_prepares_the_reference_spool_without_the_reference(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, range_bytes: int
) -> None:
    _tiny_ranges(monkeypatch, range_bytes)
    make_hostile_db(tmp_path / "src.db")
    exported = export_table(SqliteSource(tmp_path / "src.db"), "hostile", tmp_path / "h.tsv")
    python = prepare_rowbinary(exported.path, exported.receipt, tmp_path / "a")
    _no_reference(monkeypatch)
    fast = prepare_rowbinary(exported.path, exported.receipt, tmp_path / "b", mode=MODE_NATIVE)
    assert fast.path.read_bytes() == python.path.read_bytes()
    assert fast.identity == python.identity and fast.semantic_id == python.semantic_id
    assert (fast.converter, python.identity.prepared_rows > 10) == (MODE_NATIVE, True)
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["data.rowbinary"]
    assert validate_file(exported.path, exported.receipt.schema) == exported.receipt


def test_a_declined_file_goes_to_the_reference_with_the_reference_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A float longer than the compiled converter reads: the reference accepts it, the
    # compiled converter declines, and the reference converts the whole file.
    _tiny_ranges(monkeypatch, 64)
    schema = SourceSchema.of([SourceColumn("id", "int", False), SourceColumn("f", "float", True)])
    long_float = "0." + "0" * 450 + "1"
    lines = [f"{i}\t{i / 4!r}\n" for i in range(100)]
    lines[70] = f"70\t{long_float}\n"
    path = tmp_path / "in.tsv"
    path.write_bytes("".join(lines).encode())
    receipt = validate_file(path, schema, mode=MODE_PYTHON)
    assert validate_file(path, schema) == receipt
    started: list[object] = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        started.append(1)
        return convert_records(*args, **kwargs)

    python = prepare_rowbinary(path, receipt, tmp_path / "a")
    monkeypatch.setattr(preparation, "convert_records", counted)
    fast = prepare_rowbinary(path, receipt, tmp_path / "b", mode=MODE_NATIVE)
    assert fast.path.read_bytes() == python.path.read_bytes() and fast.identity == python.identity
    assert started == [1]


def test_a_source_changed_after_verification_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dpone.preparation.artifact import ArtifactMismatch

    schema = SourceSchema.of([SourceColumn("id", "int", False)])
    path = tmp_path / "in.tsv"
    path.write_bytes(b"1\n2\n3\n")
    receipt = validate_file(path, schema)
    original = native_conversion.NativeRanges.__init__

    def swap_first(self: native_conversion.NativeRanges, *args: Any, **kwargs: Any) -> None:
        path.write_bytes(b"1\n9\n3\n")  # same size, other bytes, after entry verification
        original(self, *args, **kwargs)

    monkeypatch.setattr(native_conversion.NativeRanges, "__init__", swap_first)
    with pytest.raises(ArtifactMismatch) as caught:
        prepare_rowbinary(path, receipt, tmp_path / "s", mode=MODE_NATIVE)
    assert caught.value.code == "artifact_changed_during_preparation"
    assert not (tmp_path / "s").exists()


def test_switched_off_it_is_not_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rowbinary, "_LIBRARY", None)
    plans = plan_columns([SourceColumn("id", "int", False)])
    assert not native_conversion.takes(plans)
    schema = SourceSchema.of([SourceColumn("id", "int", False)])
    path = tmp_path / "in.tsv"
    path.write_bytes(b"1\n2\n")
    receipt = validate_file(path, schema)  # the reference then
    spool = prepare_rowbinary(path, receipt, tmp_path / "s", mode=MODE_NATIVE)
    assert spool.identity.prepared_rows == 2
    spool.path.chmod(0o600)
    shutil.rmtree(spool.path.parent)


def test_parameters_beyond_the_c_side_integers_are_left_to_the_others() -> None:
    # Found by review: a FixedString width above 2**32 wrapped in the 32-bit spec, and
    # the C side then checked another width than the reference.
    for width, source_type, field in (
        (4294967301, "char(5)", b"abcde"),
        (4294967296, "binary(1)", b"\x1dE"),
    ):
        plans = (plan_column(SourceColumn("c", source_type, False), f"FixedString({width})"),)
        assert rowbinary.column_spec(plans) is None
        assert reference(plans, field + b"\n") is None
    assert rowbinary.column_spec(()) is None  # no columns: nothing to take


def test_a_record_budget_below_one_byte_is_left_to_the_reference(tmp_path: Path) -> None:
    # Found by review: the C side reads 0 as "no budget"; the reference refuses every
    # record under it.
    plans = plan_columns([SourceColumn("id", "int", False)])
    spec = rowbinary.column_spec(plans)
    assert spec is not None
    for budget in (0, -1):
        assert rowbinary.convert_range(spec, b"1\n", budget) is None
    assert rowbinary.convert_range(spec, b"1\n", 2) is not None
    schema = SourceSchema.of([SourceColumn("id", "int", False)])
    path = tmp_path / "in.tsv"
    path.write_bytes(b"1\n2\n")
    with pytest.raises(DponeError) as caught:
        validate_file(path, schema, max_record_bytes=0)
    assert caught.value.code == "record_too_large"


def test_a_fault_of_the_converter_hands_the_file_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fault(*args: object, **kwargs: object) -> None:
        raise rowbinary.NativeUnavailable("the compiled converter failed: out of memory")

    monkeypatch.setattr(rowbinary, "convert_range", fault)
    schema = SourceSchema.of([SourceColumn("id", "int", False)])
    path = tmp_path / "in.tsv"
    path.write_bytes(b"1\n2\n")
    receipt = validate_file(path, schema)  # the reference, then
    assert receipt == validate_file(path, schema, mode=MODE_PYTHON)
    spool = prepare_rowbinary(path, receipt, tmp_path / "s", mode=MODE_NATIVE)
    assert spool.path.read_bytes() == b"\x01\x00\x00\x00\x02\x00\x00\x00"


def test_validation_does_not_keep_the_bytes() -> None:
    plans = plan_columns([SourceColumn("id", "int", False)])
    spec = rowbinary.column_spec(plans)
    assert spec is not None
    part = rowbinary.convert_range(spec, b"1\n2\n", keep=False)
    kept = rowbinary.convert_range(spec, b"1\n2\n")
    assert part is not None and kept is not None
    assert (part.data, part.rows, part.rows_digest) == (b"", 2, kept.rows_digest)
    assert kept.data == b"\x01\x00\x00\x00\x02\x00\x00\x00"


@settings(max_examples=30, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 10**20), st.integers(0, 22), st.integers(-30, 30), st.booleans()),
        min_size=100,
        max_size=100,
    )
)
def test_float64_near_the_fast_path_bounds_is_the_exact_parse(
    parts: list[tuple[int, int, int, bool]],
) -> None:
    # Significands around 2**53 and powers of ten around 22, with the point anywhere:
    # the compiled converter's fast path and its strtod must both give float()'s value.
    plans = (plan_column(SourceColumn("c", "float", False)),)
    edges = [
        "9007199254740992",
        "9007199254740993",
        "9007199254740991e22",
        "9007199254740993e-22",
        "1e22",
        "1e23",
        "1e-22",
        "1e-23",
        "4.9e-324",
        "2.2250738585072014e-308",
        "0.1e-21",
    ]
    texts = list(edges)
    for significand, point, exponent, negative in parts:
        digits = str(significand)
        if 0 < point < len(digits) and digits[0] != "0":
            digits = f"{digits[:point]}.{digits[point:]}"
        texts.append(("-" if negative else "") + digits + (f"e{exponent}" if exponent else ""))
    for text in texts:
        data = text.encode() + b"\n"
        ours = native(plans, data)
        assert ours == reference(plans, data), text
        assert ours is not None, text


def test_a_family_the_c_side_does_not_know_is_declined_never_a_key_error() -> None:
    """Before: a family added to the policy before the C side learned it raised
    KeyError from column_spec, which a user saw as an internal error (issue 34)."""
    known = plan_column(SourceColumn("n", "int", False))
    assert rowbinary.column_spec((known,)) is not None
    assert known.target is not None
    unknown = dataclasses.replace(
        known, target=dataclasses.replace(known.target, family="ipv4", text="IPv4")
    )
    assert rowbinary.column_spec((known, unknown)) is None  # the reference's, whole
