"""The engine fast path against the Python reference: identical bytes, identical refusals."""

from __future__ import annotations

import io
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpone.connectors.bulk_text_codec import BulkTextReader, encode_record
from dpone.contracts.preparation import rows_digest
from dpone.contracts.schema import SourceColumn
from dpone.errors import DponeError
from dpone.exporters.export import export_table
from dpone.exporters.sources import SqliteSource
from dpone.preparation.conversion import ValueNotRepresentable, convert_records
from dpone.preparation.engine_conversion import (
    MODE_ENGINE,
    EngineUnavailable,
    canonical_expressions,
    conversion_sql,
    convert_with_engine,
    fast_expressions,
    field_expressions,
    run_engine_query,
    tiered_expressions,
)
from dpone.preparation.file_validation import validate_file
from dpone.preparation.spool import (
    MODE_PYTHON,
    PreparationBudget,
    PreparationError,
    prepare_rowbinary,
)
from dpone.sql import quote_literal
from dpone.typepolicy import ColumnPlan, plan_column, plan_columns
from tests.hostile_values import HOSTILE_BINARY, HOSTILE_TEXT
from tests.integration.test_export_validate import make_hostile_db
from tests.unit import test_type_policy as tp

REFUSED = tp.REFUSED


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


def engine(plans: tuple[ColumnPlan, ...], data: bytes, tmp_path: Path) -> tuple[bytes, str] | None:
    """The engine's spool bytes and the rows digest it computed from the spool it wrote."""
    source, out = tmp_path / "in.tsv", tmp_path / "out.rb"
    source.write_bytes(data)
    written = convert_with_engine(plans, source, out, timeout=120)
    if written is None:
        return None
    assert written.rows == data.count(b"\n")
    return out.read_bytes(), written.rows_digest


def encode_rows(plans: tuple[ColumnPlan, ...], rows: list[list[Any]]) -> bytes:
    return b"".join(encode_record([p.codec_column for p in plans], row) for row in rows)


def test_every_edge_value_of_every_type_gives_identical_bytes(tmp_path: Path) -> None:
    by_type: dict[str, list[str]] = {}
    for source_type, text, _ in tp.EXACT:
        by_type.setdefault(source_type, []).append(text)
    plans = plan_columns([SourceColumn(f"c{i}", t, True) for i, t in enumerate(by_type)])
    depth = max(len(v) for v in by_type.values())
    rows = [
        [values[r] if r < len(values) else None for values in by_type.values()]
        for r in range(depth)
    ]
    rows.append([None] * len(plans))
    data = encode_rows(plans, rows)
    expected = reference(plans, data)
    assert expected is not None
    assert engine(plans, data, tmp_path) == expected


def test_hostile_text_and_binary_give_identical_bytes(tmp_path: Path) -> None:
    plans = plan_columns(
        [
            SourceColumn("t", "nvarchar(max)", True),
            SourceColumn("b", "varbinary(max)", True),
            SourceColumn("f", "char(3)", False),
        ],
        {"f": "FixedString(3)"},
    )
    rows = [[t, None, "abc"] for t in HOSTILE_TEXT] + [[None, b, "xyz"] for b in HOSTILE_BINARY]
    data = (
        encode_rows(plans, rows) + b"\\N\tab CD\x0b01\rFF\tabc\n"
    )  # literal \N text; hex with whitespace
    expected = reference(plans, data)
    assert expected is not None
    assert engine(plans, data, tmp_path) == expected


def test_text_the_canonical_query_refuses_is_converted_by_the_tiered_one(tmp_path: Path) -> None:
    plans = plan_columns(
        [
            SourceColumn("d", "decimal(5, 2)", True),
            SourceColumn("b", "varbinary(8)", True),
            SourceColumn("u", "uniqueidentifier", True),
        ]
    )
    canonical = b"1.50\tab\t6f9619ff-8b86-d011-b42d-00c04fc964ff\n"
    for other in (
        b"1.500\t\t\n",
        b"\tAB\t\n",
        b"\tab cd\t\n",
        b"\t\t6F9619FF-8B86-D011-B42D-00C04FC964FF\n",
    ):
        data = canonical + other
        source = tmp_path / "in.tsv"
        source.write_bytes(data)
        # The canonical query refuses the file, so the tiered one converted it.
        with pytest.raises(EngineUnavailable, match="refused by the policy"):
            run_engine_query(conversion_sql(plans, source, tmp_path / "c.rb", canonical=True))
        expected = reference(plans, data)
        assert expected is not None
        assert engine(plans, data, tmp_path) == expected
    # And what it accepts, it converts as the tiered query does.
    source.write_bytes(canonical)
    run_engine_query(conversion_sql(plans, source, tmp_path / "c.rb", canonical=True))
    run_engine_query(conversion_sql(plans, source, tmp_path / "t.rb"))
    assert (tmp_path / "c.rb").read_bytes() == (tmp_path / "t.rb").read_bytes() != b""


def acceptance(
    cases: list[tuple[str, bool, bytes]],
    expressions: Callable[[ColumnPlan, str], tuple[str, str]] = tiered_expressions,
) -> list[bool]:
    """The engine's verdict on single fields, in one engine run."""
    selects: list[str] = []
    for source_type, nullable, field in cases:
        plan = plan_column(SourceColumn("c", source_type, nullable))
        literal = (
            quote_literal(field.decode("utf-8", errors="surrogateescape"))
            if _utf8(field)
            else f"unhex('{field.hex()}')"
        )
        ok, _ = expressions(plan, literal)
        not_null = f"({literal} = '' OR ({ok}))" if nullable else f"({literal} != '' AND ({ok}))"
        selects.append(f"SELECT {len(selects)} AS i, toUInt8({not_null}) AS ok")
    out = run_engine_query(
        f"SELECT ok FROM ({' UNION ALL '.join(selects)}) ORDER BY i "
        # As the conversion parses floats; every check on every value, as validation's
        # eager canonical checks (none may throw); room for thousands of checks at once.
        "SETTINGS precise_float_parsing = 1, short_circuit_function_evaluation = 'disable', "
        "max_ast_elements = 10000000, "
        "max_expanded_ast_elements = 10000000, query_plan_max_optimizations_to_apply = 1000000"
    )
    return [line == b"1" for line in out.splitlines()]


def _utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


EXTRA_FIELDS = [
    ("nvarchar(5)", b"a\x1dX"),
    ("nvarchar(5)", b"a\x1d"),
    ("nvarchar(5)", b"\x1dEa"),
    ("nvarchar(5)", b"a\rb"),
    ("nvarchar(5)", b"\xff"),
    ("nvarchar(5)", b"\x1dE"),
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


def test_refusals_agree_with_the_reference() -> None:
    cases: list[tuple[str, bool, bytes]] = []
    for source_type, text, _ in REFUSED:
        cases += [(source_type, False, text.encode()), (source_type, True, text.encode())]
    for source_type, text, _ in tp.EXACT:
        cases.append((source_type, False, text.encode()))
    for source_type, field in EXTRA_FIELDS:
        cases += [
            (source_type, False, field),
            (source_type, True, field),
            (source_type, False, b""),
        ]
    verdicts = acceptance(cases)
    for (source_type, nullable, field), engine_ok in zip(cases, verdicts, strict=True):
        plans = (plan_column(SourceColumn("c", source_type, nullable)),)
        python_ok = reference(plans, field + b"\n") is not None
        assert engine_ok == python_ok, (source_type, nullable, field)


def test_the_canonical_query_accepts_only_what_the_reference_accepts() -> None:
    cases: list[tuple[str, bool, bytes]] = []
    for source_type, text, _ in [*REFUSED, *tp.EXACT]:
        cases += [(source_type, False, text.encode()), (source_type, True, text.encode())]
    for source_type, field in EXTRA_FIELDS:
        cases += [(source_type, False, field), (source_type, True, field)]
    for source_type in FAST_TIER_TYPES:
        cases += [(source_type, True, text.encode()) for text in FAST_TIER_FIELDS]
    accepted = 0
    for (source_type, nullable, field), ok in zip(
        cases, acceptance(cases, canonical_expressions), strict=True
    ):
        if ok:
            accepted += 1
            plans = (plan_column(SourceColumn("c", source_type, nullable)),)
            assert reference(plans, field + b"\n") is not None, (source_type, nullable, field)
    assert accepted >= 100, accepted  # not vacuous: canonical text passes


FAST_TIER_TYPES = [
    "bit",
    "date",
    "datetime",
    "datetime2(0)",
    "datetime2(3)",
    "datetime2(7)",
    "smalldatetime",
    "decimal(5, 2)",
    "decimal(18, 4)",
    "decimal(38, 10)",
    "decimal(4, 4)",
    "money",
    "float",
    "decimal(9, 0)",
    "decimal(10, 0)",
    "decimal(38, 0)",
    "decimal(9, 2)",
    "decimal(10, 2)",
    "uniqueidentifier",
    "varbinary(64)",
]
FAST_TIER_FIELDS = [
    "1900-01-01 00:00:00",
    "1899-12-31 23:59:59.9999999",
    "2300-01-01 00:00:00.0000000",
    "2299-12-31 23:59:59.9999999",
    "2020-02-30 00:00:00.0000000",
    "2020-01-01T12:00:00.0000000",
    "2020-01-01 12:00:00.123",
    "2020-01-01 12:00:00.1230000",
    "2020-01-01 12:00:00.1234567Z",
    "2020-01-01 24:00:00.0000000",
    "2020-1-01 12:00:00",
    " 2020-01-01 12:00:00",
    "1970-01-01 00:00:00",
    "2000-02-29",
    "1900-01-01",
    "2299-12-31",
    "1899-12-31",
    "2300-01-01",
    "2021-02-29",
    "2021-1-1",
    "0.0000",
    "-0.0000",
    "1.5000",
    "1.5",
    "-7488955808341.9980",
    "99999999999999.9999",
    "999999999999999.9999",
    "123.45",
    "1234.56",
    "0.12",
    "00.12",
    "+1.50",
    "1e2",
    " 1.50",
    "1.50 ",
    "0.1234",
    "1.0000000000",
    "-99999999999999999999999999.9999999999",
    "0",
    "1",
    "-0",
    "2",
    "true",
    "0.1",
    "1e16",
    "1e+16",
    "10000000000000000",
    "5e-324",
    "1e-400",
    "1.7976931348623157e308",
    "inf",
    "nan",
    "-nan",
    "0.30000000000000004",
    "1e300",
    "1E300",
    "6f9619ff-8b86-d011-b42d-00c04fc964ff",
    "6F9619FF-8B86-D011-B42D-00C04FC964FF",
    "00",
    "ff",
    "0a1b",
    "0A1B",
    "0a1B",
    "abc",
    "a",
    "ab cd",
    "ab\rcd",
    "ab\x0bcd",
    "zz",
    "0g",
    "g0",
    "\x1dE",
    "\x1dEab",
    "ab\x1dE",
    "\x00\x00",
    "ab\x00",
    "{6f9619ff-8b86-d011-b42d-00c04fc964ff}",
    "6f9619ff8b86d011b42d00c04fc964ff",
    "1.",
    ".5",
    "-.50",
    "--1.50",
    "1.2.3",
    "-0",
    "-0.0",
    "-0.5",
    "1.500",
    "1.505",
    "2147483648",
    "-2147483648",
    "4294967296",
    "9223372036854775808",
    "99999999999.99",
    "0x10",
    "1.0",
    "12",
    "100.0",
    "100.00",
    "1.5e+300",
    "1.5e300",
    "1.0e+300",
    "0.1.0",
    "1e+22",
    "1e+16",
    "1e-05",
    "1e+",
    "1e+-5",
    "inf.0",
    "nan.0",
    "1234567.5",
    "12345678.5",
    "9999999.99",
    "-9999999.99",
    "1.5e-05",
    "-1.5e-05",
    "1.5e-07",
    "1.5e-7",
    "1.397384541412805e-05",
    "9.999999999999999e-08",
    "1.2345678901234567e+19",
    "1e+308",
    "1e+309",
    "1e-324",
    "1.5E-05",
    "01.5e-05",
    "1.e-05",
    "1.5e-05 ",
    "1.5e--05",
    "1.5e-0x5",
    "-0e-05",
    "0e-05",
    "1.50e-05",
    "1x5e-05",
    "1,5e-05",
    "1.5e+99999999999999999999",
    "1.5e-99999999999999999999",
]


def test_the_fast_tier_accepts_only_what_the_full_tier_accepts_with_the_same_value() -> None:
    texts = sorted({t for _, t, _ in tp.EXACT} | {t for _, t, _ in REFUSED} | set(FAST_TIER_FIELDS))
    selects: list[str] = []
    for source_type in FAST_TIER_TYPES:
        plan = plan_column(SourceColumn("c", source_type, False))
        for text in texts:
            literal = quote_literal(text)
            fast = fast_expressions(plan, literal)
            assert fast is not None or source_type in ("decimal(4, 4)", "smalldatetime")
            if fast is None:
                continue
            fast_ok, fast_value = fast
            ok, value = field_expressions(plan, literal)
            # Compared as RowBinary bytes: equal values of a float may differ in sign.
            same = (
                "1"
                if fast_value is None
                else f"formatRow('RowBinary', {fast_value}) = formatRow('RowBinary', {value})"
            )
            selects.append(
                f"SELECT {len(selects)} AS i, {quote_literal(source_type)} AS t, {literal} AS f, "
                f"toUInt8({fast_ok}) AS fast, toUInt8({ok}) AS full, "
                f"if(toUInt8({fast_ok}), toUInt8({same}), 1) AS same"
            )
    out = run_engine_query(
        f"SELECT t, f, fast, full, same FROM ({' UNION ALL '.join(selects)}) ORDER BY i "
        "SETTINGS precise_float_parsing = 1, max_ast_elements = 10000000, max_expanded_ast_elements = 10000000, "
        "query_plan_max_optimizations_to_apply = 1000000"
    )
    fast_accepted = set()
    for line in out.decode().split("\n")[:-1]:  # not splitlines: fields hold \x0b, \x1d
        source_type, text, fast_flag, full, same = line.split("\t")
        if fast_flag == "1":
            fast_accepted.add((source_type, text))
            assert (full, same) == ("1", "1"), (source_type, text)
    # Not vacuous: the canonical form of every fast type passes the fast tier.
    assert len(fast_accepted) >= 25, len(fast_accepted)
    # Python's spellings of floats (what exporters write) stay on the fast tier.
    for text in ("100.0", "1.5e+300", "1.5e-05", "1.397384541412805e-05", "1e+16", "1.5e-07"):
        assert ("float", text) in fast_accepted, text
    assert ("float", "01.5e-05") not in fast_accepted and ("float", "1.5E-05") not in fast_accepted


def test_a_refused_file_is_refused_by_the_engine(tmp_path: Path) -> None:
    plans = plan_columns([SourceColumn("d", "date", False)])
    assert engine(plans, b"2000-01-01\n1899-12-31\n", tmp_path) is None
    assert engine(plans, b"2000-01-01\n2000-01-02\textra\n", tmp_path) is None


numbers = st.one_of(
    st.integers(-(2**63), 2**63 - 1).map(str),
    st.decimals(min_value=-(10**12), max_value=10**12, places=4, allow_nan=False).map(
        lambda d: format(d, "f")
    ),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.floats(width=32, allow_nan=False, allow_infinity=False).map(repr),
    st.text(alphabet="0123456789-.eE+ ", max_size=12),
)
NUMERIC_TYPES = [
    "int",
    "bigint",
    "decimal(18, 4)",
    "decimal(38, 10)",
    "float",
    "real",
    "smallmoney",
    "tinyint",
]


@settings(
    max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(numbers, min_size=50, max_size=50))
def test_random_numbers_agree(values: list[str]) -> None:
    cases = [(t, True, v.encode()) for t in NUMERIC_TYPES for v in values]
    verdicts = acceptance(cases)
    for (source_type, nullable, field), engine_ok in zip(cases, verdicts, strict=True):
        plans = (plan_column(SourceColumn("c", source_type, nullable)),)
        assert engine_ok == (reference(plans, field + b"\n") is not None), (source_type, field)


@settings(
    max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.one_of(
            st.none(), st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=40)
        ),
        min_size=1,
        max_size=60,
    ),
    st.lists(
        st.one_of(
            st.none(), st.decimals(min_value=-(10**13), max_value=10**13, places=4, allow_nan=False)
        ),
        min_size=60,
        max_size=60,
    ),
    st.lists(
        st.one_of(st.none(), st.floats(allow_nan=False, allow_infinity=False)),
        min_size=60,
        max_size=60,
    ),
    st.lists(
        st.one_of(
            st.none(),
            st.datetimes(
                min_value=__import__("datetime").datetime(1900, 1, 1),
                max_value=__import__("datetime").datetime(2299, 12, 31),
            ),
        ),
        min_size=60,
        max_size=60,
    ),
)
def test_random_valid_rows_give_identical_bytes(
    tmp_path_factory: pytest.TempPathFactory,
    texts: list[Any],
    decimals: list[Any],
    floats: list[Any],
    stamps: list[Any],
) -> None:
    plans = plan_columns(
        [
            SourceColumn("t", "nvarchar(max)", True),
            SourceColumn("d", "decimal(18, 4)", True),
            SourceColumn("f", "float", True),
            SourceColumn("s", "datetime2(6)", True),
        ]
    )
    rows = [
        [
            t,
            None if d is None else format(d, "f"),
            None if f is None else repr(f),
            None if s is None else s.strftime("%Y-%m-%d %H:%M:%S.%f"),
        ]
        for t, d, f, s in zip(texts, decimals, floats, stamps, strict=False)
    ]
    data = encode_rows(plans, rows)
    expected = reference(plans, data)
    assert expected is not None
    assert engine(plans, data, tmp_path_factory.mktemp("eng")) == expected


def test_engine_mode_prepares_the_same_spool(tmp_path: Path) -> None:
    make_hostile_db(tmp_path / "src.db")
    exported = export_table(SqliteSource(tmp_path / "src.db"), "hostile", tmp_path / "h.tsv")
    python = prepare_rowbinary(exported.path, exported.receipt, tmp_path / "a")
    fast = prepare_rowbinary(exported.path, exported.receipt, tmp_path / "b", mode=MODE_ENGINE)
    assert fast.path.read_bytes() == python.path.read_bytes()
    assert fast.identity.rowbinary_sha256 == python.identity.rowbinary_sha256
    assert fast.identity.rows_digest == python.identity.rows_digest
    assert python.identity.rows_digest != "0" * 32
    # Same bytes, same identity: the semantic id does not depend on the converter.
    assert (fast.mode, python.mode) == (MODE_ENGINE, MODE_PYTHON)
    assert fast.identity == python.identity and fast.semantic_id == python.semantic_id
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == [
        "data.rowbinary"
    ]  # the private copy is gone
    assert oct(os.stat(fast.path).st_mode & 0o777) == "0o400"


def test_engine_mode_refusals_name_the_same_position(tmp_path: Path) -> None:
    from dpone.contracts.schema import SourceSchema
    from dpone.preparation.file_validation import validate_file

    path = tmp_path / "in.tsv"
    path.write_bytes(b"1\t2020-01-01\n2\t2020-01-02\n")
    receipt = validate_file(
        path,
        SourceSchema.of(
            [SourceColumn("id", "int", False), SourceColumn("d", "nvarchar(20)", True)]
        ),
    )
    lying = type(receipt)(
        **{
            **receipt.__dict__,
            "schema": SourceSchema.of(
                [SourceColumn("id", "tinyint", False), SourceColumn("d", "date", True)]
            ),
        }
    )
    path.write_bytes(
        b"1\t2020-01-01\n2\t1800-01-02\n"
    )  # same size, different bytes: refused before conversion
    with pytest.raises(DponeError):
        prepare_rowbinary(path, lying, tmp_path / "x", mode=MODE_ENGINE)
    path.write_bytes(b"1\t2020-01-01\n2\t2020-01-02\n")
    bad = tmp_path / "bad.tsv"
    bad.write_bytes(b"1\t2020-01-01\n2\t1800-01-02\n")
    receipt_bad = validate_file(
        bad,
        SourceSchema.of(
            [SourceColumn("id", "int", False), SourceColumn("d", "nvarchar(20)", True)]
        ),
    )
    lying_bad = type(receipt_bad)(**{**receipt_bad.__dict__, "schema": lying.schema})
    with pytest.raises(ValueNotRepresentable) as caught:
        prepare_rowbinary(bad, lying_bad, tmp_path / "y", mode=MODE_ENGINE)
    assert (caught.value.details["record"], caught.value.details["column"]) == (2, "d")
    assert not (tmp_path / "y").exists()
    with pytest.raises(PreparationError) as budget:
        prepare_rowbinary(
            path,
            receipt,
            tmp_path / "z",
            mode=MODE_ENGINE,
            budget=PreparationBudget(max_record_bytes=5),
        )
    assert budget.value.code == "record_too_large" and budget.value.details["record"] == 1


def test_engine_rows_digest_of_an_empty_file_is_zero(tmp_path: Path) -> None:
    plans = plan_columns([SourceColumn("id", "int", False), SourceColumn("s", "nvarchar(5)", True)])
    assert engine(plans, b"", tmp_path) == (b"", "0" * 32) == reference(plans, b"")


def test_engine_rows_digest_ignores_row_order_but_not_content(tmp_path: Path) -> None:
    plans = plan_columns([SourceColumn("id", "int", False), SourceColumn("s", "nvarchar(5)", True)])
    rows = [[str(i), None if i % 3 == 0 else f"v{i}"] for i in range(50)]
    for name in "fbc":
        (tmp_path / name).mkdir()
    forward = engine(plans, encode_rows(plans, rows), tmp_path / "f")
    backward = engine(plans, encode_rows(plans, rows[::-1]), tmp_path / "b")
    changed = engine(plans, encode_rows(plans, [*rows[:-1], ["49", "v48"]]), tmp_path / "c")
    assert forward is not None and backward is not None and changed is not None
    assert forward[0] != backward[0] and forward[1] == backward[1]
    assert changed[1] != forward[1]
    assert forward == reference(plans, encode_rows(plans, rows))


def _tiny_ranges(monkeypatch: pytest.MonkeyPatch, size: int) -> None:
    """Make the engine path (preparation and validation) split even a small file into
    many ranges."""
    from dpone.preparation import engine_conversion

    monkeypatch.setattr(engine_conversion, "MIN_RANGE_BYTES", size)
    monkeypatch.setattr(engine_conversion, "MAX_RANGE_BYTES", size)


@pytest.mark.parametrize("range_bytes", [1, 97, 4096])
def test_ranges_join_into_the_reference_spool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, range_bytes: int
) -> None:
    # Hostile text and binary (records longer than a range, escapes, NULLs, the empty
    # value) converted in many ranges on parallel workers: the joined spool, its rows
    # digest and the identity are the reference's.
    _tiny_ranges(monkeypatch, range_bytes)
    make_hostile_db(tmp_path / "src.db")
    exported = export_table(SqliteSource(tmp_path / "src.db"), "hostile", tmp_path / "h.tsv")
    python = prepare_rowbinary(exported.path, exported.receipt, tmp_path / "a")
    fast = prepare_rowbinary(exported.path, exported.receipt, tmp_path / "b", mode=MODE_ENGINE)
    assert fast.path.read_bytes() == python.path.read_bytes()
    assert fast.identity == python.identity and python.identity.prepared_rows > 10
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["data.rowbinary"]


def test_a_refusal_or_budget_in_a_later_range_names_the_reference_position(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dpone.contracts.schema import SourceSchema
    from dpone.preparation.file_validation import validate_file

    _tiny_ranges(monkeypatch, 64)
    good = SourceSchema.of(
        [SourceColumn("id", "int", False), SourceColumn("d", "nvarchar(20)", True)]
    )
    strict = SourceSchema.of([SourceColumn("id", "int", False), SourceColumn("d", "date", True)])
    lines = [b"%d\t2020-01-%02d\n" % (i, i % 28 + 1) for i in range(1, 200)]
    lines[150] = b"151\t2020-02-30\n"  # not a calendar date: refused by the policy
    path = tmp_path / "in.tsv"
    path.write_bytes(b"".join(lines))
    receipt = validate_file(path, good)
    lying = type(receipt)(**{**receipt.__dict__, "schema": strict})
    errors = []
    from dpone.preparation import native_conversion
    from dpone.preparation.native_conversion import MODE_NATIVE

    monkeypatch.setattr(native_conversion, "MIN_RANGE_BYTES", 64)
    monkeypatch.setattr(native_conversion, "MAX_RANGE_BYTES", 64)
    for name, mode in (("p", MODE_PYTHON), ("e", MODE_ENGINE), ("n", MODE_NATIVE)):
        with pytest.raises(ValueNotRepresentable) as caught:
            prepare_rowbinary(path, lying, tmp_path / name, mode=mode)
        errors.append(
            (caught.value.code, caught.value.details["record"], caught.value.details["column"])
        )
        assert not (tmp_path / name).exists()
    assert errors[0] == errors[1] == errors[2] and errors[0][1:] == (151, "d")
    # Budgets the fast paths cannot name exactly go to the reference, which does.
    for budget, code, record in (
        (PreparationBudget(max_record_bytes=14), "record_too_large", 100),
        (PreparationBudget(max_rows=120), "too_many_records", 121),
        (PreparationBudget(max_spool_bytes=700), "spool_budget_exceeded", None),
    ):
        for mode in (MODE_ENGINE, MODE_NATIVE):
            with pytest.raises(DponeError) as stopped:
                prepare_rowbinary(path, receipt, tmp_path / "y", mode=mode, budget=budget)
            assert stopped.value.code == code
            if record is not None:
                assert stopped.value.details["record"] == record
            assert not (tmp_path / "y").exists()


@settings(
    max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.tuples(
            st.one_of(
                st.none(), st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=30)
            ),
            st.one_of(st.none(), st.binary(max_size=20)),
            st.integers(-(2**63), 2**63 - 1),
        ),
        min_size=0,
        max_size=80,
    ),
    st.sampled_from([1, 33, 500]),
)
def test_random_files_in_ranges_give_the_reference_identity(
    tmp_path_factory: pytest.TempPathFactory, rows: list[Any], range_bytes: int
) -> None:
    from dpone.contracts.schema import SourceSchema
    from dpone.preparation import engine_conversion

    schema = SourceSchema.of(
        [
            SourceColumn("t", "nvarchar(max)", True),
            SourceColumn("b", "varbinary(max)", True),
            SourceColumn("i", "bigint", False),
        ]
    )
    plans = plan_columns(schema.columns)
    work = tmp_path_factory.mktemp("ranges")
    path = work / "in.tsv"
    path.write_bytes(encode_rows(plans, [[t, b, str(i)] for t, b, i in rows]))
    receipt = validate_file(path, schema)
    saved = engine_conversion.MIN_RANGE_BYTES, engine_conversion.MAX_RANGE_BYTES
    engine_conversion.MIN_RANGE_BYTES = engine_conversion.MAX_RANGE_BYTES = range_bytes
    try:
        python = prepare_rowbinary(path, receipt, work / "a")
        fast = prepare_rowbinary(path, receipt, work / "b", mode=MODE_ENGINE)
    finally:
        engine_conversion.MIN_RANGE_BYTES, engine_conversion.MAX_RANGE_BYTES = saved
    assert fast.path.read_bytes() == python.path.read_bytes()
    assert fast.identity == python.identity
    assert validate_file(path, schema, mode=MODE_ENGINE) == receipt
    assert validate_file(path, schema, mode=MODE_PYTHON) == receipt


def test_engine_validation_gives_the_reference_receipt_without_the_reference(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dpone.preparation import file_validation

    make_hostile_db(tmp_path / "src.db")
    exported = export_table(SqliteSource(tmp_path / "src.db"), "hostile", tmp_path / "h.tsv")
    schema = exported.receipt.schema
    reference_receipt = file_validation.validate_file(exported.path, schema, mode=MODE_PYTHON)

    def no_reference(*args: object, **kwargs: object) -> int:
        raise AssertionError("the engine path handed a valid file to the reference")

    monkeypatch.setattr(file_validation, "convert_records", no_reference)
    _tiny_ranges(monkeypatch, 50)  # many ranges
    assert (
        file_validation.validate_file(exported.path, schema, mode=MODE_ENGINE) == reference_receipt
    )
    assert (
        file_validation.validate_file(tmp_path / "h.tsv", schema, mode=MODE_ENGINE)
        == exported.receipt
    )


@pytest.mark.parametrize(
    ("data", "budget"),
    [
        (b"1\t2020-01-01\n" * 40 + b"2\t2020-02-30\n" + b"3\t2020-01-01\n", {}),  # not a date
        (b"1\t2020-01-01\n" * 40 + b"x\t2020-01-01\n", {}),  # not an integer
        (b"1\t2020-01-01\n" * 40 + b"1\t2020-01-01\textra\n", {}),  # too wide
        (b"1\t2020-01-01\n" * 40 + b"1\t2020-01-01", {}),  # no final LF
        (b"1\t2020-01-01\n" * 40 + b"\t2020-01-01\n", {}),  # NULL in NOT NULL
        (b"1\t2020-01-01\n" * 40 + b"1\t\x1dX\n", {}),  # unknown escape
        (b"1\t2020-01-01\n" * 40 + b"12\t2020-01-01\n", {"max_record_bytes": 13}),
        (b"1\t2020-01-01\n" * 41, {"max_records": 40}),
    ],
)
def test_fast_validations_refuse_where_the_reference_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, data: bytes, budget: dict[str, int]
) -> None:
    from dpone.contracts.schema import SourceSchema
    from dpone.preparation import file_validation, native_conversion
    from dpone.preparation.native_conversion import MODE_NATIVE

    _tiny_ranges(monkeypatch, 64)
    monkeypatch.setattr(native_conversion, "MIN_RANGE_BYTES", 64)
    monkeypatch.setattr(native_conversion, "MAX_RANGE_BYTES", 64)
    schema = SourceSchema.of([SourceColumn("id", "int", False), SourceColumn("d", "date", True)])
    path = tmp_path / "in.tsv"
    path.write_bytes(data)
    refusals = []
    for mode in (MODE_PYTHON, MODE_ENGINE, MODE_NATIVE):
        with pytest.raises(DponeError) as caught:
            file_validation.validate_file(path, schema, mode=mode, **budget)  # type: ignore[arg-type]
        details = caught.value.details
        refusals.append(
            (type(caught.value), caught.value.code, details.get("record"), details.get("column"))
        )
    assert refusals[0] == refusals[1] == refusals[2]
    assert refusals[0][2] in (41, 42)


def test_a_record_longer_than_the_engine_holds_is_left_to_the_reference(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No record budget, and a record longer than the engine path keeps in memory: the
    # reference converts the file (no false engine_divergence), with the same result.
    from dpone.contracts.schema import SourceSchema
    from dpone.preparation import spool as preparation
    from dpone.preparation.file_validation import validate_file

    _tiny_ranges(monkeypatch, 16)
    monkeypatch.setattr(preparation, "MAX_CARRY_BYTES", 40)
    schema = SourceSchema.of(
        [SourceColumn("id", "int", False), SourceColumn("t", "nvarchar(max)", True)]
    )
    path = tmp_path / "in.tsv"
    path.write_bytes(b"1\tshort\n2\t" + b"x" * 200 + b"\n3\t\n")
    receipt = validate_file(path, schema)
    python = prepare_rowbinary(path, receipt, tmp_path / "a")
    fast = prepare_rowbinary(path, receipt, tmp_path / "b", mode=MODE_ENGINE)
    assert fast.path.read_bytes() == python.path.read_bytes()
    assert fast.identity == python.identity and fast.identity.prepared_rows == 3


def test_a_non_canonical_range_among_canonical_ones_gives_the_reference_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dpone.contracts.schema import SourceSchema
    from dpone.preparation import file_validation

    schema = SourceSchema.of(
        [
            SourceColumn("d", "decimal(10, 2)", True),
            SourceColumn("f", "float", True),
            SourceColumn("b", "varbinary(8)", True),
        ]
    )
    plans = plan_columns(schema.columns)
    rows = [[f"{i}.25", repr(i + 0.5), bytes([i % 256])] for i in range(200)]
    rows[97] = ["1.5", "100.0", b""]  # plain decimal, whole float, empty binary: canonical still
    data = encode_rows(plans, rows)
    odd = data.replace(b"\t0a\n", b"\t0A\n", 1)  # capital hex: only the tiered query
    assert odd != data
    for content in (data, odd):
        path = tmp_path / "in.tsv"
        path.write_bytes(content)
        receipt = validate_file(path, schema, mode=MODE_PYTHON)
        _tiny_ranges(monkeypatch, 300)  # about 20 ranges, both workers busy
        python = prepare_rowbinary(path, receipt, tmp_path / "a")
        fast = prepare_rowbinary(path, receipt, tmp_path / "b", mode=MODE_ENGINE)
        assert fast.path.read_bytes() == python.path.read_bytes()
        assert fast.identity == python.identity

        def no_reference(*args: object, **kwargs: object) -> int:
            raise AssertionError("the engine path handed a valid file to the reference")

        with monkeypatch.context() as patched:
            patched.setattr(file_validation, "convert_records", no_reference)
            assert file_validation.validate_file(path, schema, mode=MODE_ENGINE) == receipt
        for spool in (python, fast):
            spool.path.chmod(0o600)
            shutil.rmtree(spool.path.parent)


def test_a_full_scratch_is_a_coded_engine_error_and_validation_falls_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import hashlib

    from dpone.contracts.schema import SourceSchema
    from dpone.preparation import engine_conversion, file_validation

    with pytest.raises(EngineUnavailable) as caught:
        engine_conversion.spill_range(tmp_path / "gone" / "in-0", b"1\n", 2, hashlib.sha256())
    assert caught.value.code == "engine_scratch"
    assert "DPONE_ENGINE_SCRATCH" in str(caught.value) and str(tmp_path / "gone") in str(
        caught.value
    )

    def full(*args: object, **kwargs: object) -> int:
        raise EngineUnavailable("no room", code="engine_scratch")

    schema = SourceSchema.of([SourceColumn("id", "int", False)])
    path = tmp_path / "in.tsv"
    path.write_bytes(b"1\n2\n")
    monkeypatch.setattr(file_validation, "spill_range", full)
    warned: list[str] = []
    receipt = file_validation.validate_file(path, schema, mode=MODE_ENGINE, warn=warned.append)
    assert receipt.rows_validated == 2  # the reference
    assert len(warned) == 1 and "Python reference" in warned[0] and "engine_scratch" in warned[0]


def test_the_tiered_query_reads_smaller_blocks() -> None:
    """Its intermediate columns cost memory per block (see TIERED_BLOCK_ROWS)."""
    from dpone.preparation.engine_conversion import BLOCK_ROWS, TIERED_BLOCK_ROWS, check_sql

    plans = plan_columns([SourceColumn("d", "date", False)])
    assert TIERED_BLOCK_ROWS < BLOCK_ROWS
    for canonical, rows in ((True, BLOCK_ROWS), (False, TIERED_BLOCK_ROWS)):
        converting = conversion_sql(plans, Path("in"), Path("out"), canonical=canonical)
        checking = check_sql(plans, Path("in"), canonical=canonical)
        assert f"max_block_size = {rows}," in converting
        assert f"max_block_size = {rows}," in checking
