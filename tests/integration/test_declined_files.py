"""Whole preparations and validations: the compiled converter or, for what it declines,
the Python reference, with the reference's bytes, identity and verdicts either way.

Moved here, adapted, from the tests of the removed engine converter where they held
behaviour that stays: refusals and budgets named at the reference's record and column,
files cut into many ranges, a record longer than a range holds. New: a file the
compiled converter does not take (a wide decimal override) is the reference's, and a
removed preparation mode is a typed error naming its replacement.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpone.contracts.schema import SourceColumn, SourceSchema
from dpone.errors import DponeError
from dpone.exporters.export import export_table
from dpone.exporters.sources import SqliteSource
from dpone.ports.clickhouse_request import Credentials, Endpoint
from dpone.preparation import file_validation, native_conversion
from dpone.preparation import spool as preparation
from dpone.preparation.conversion import ValueNotRepresentable
from dpone.preparation.file_validation import validate_file
from dpone.preparation.modes import PreparationModeRemoved
from dpone.preparation.native import rowbinary
from dpone.preparation.native_conversion import MODE_NATIVE
from dpone.preparation.spool import (
    MODE_PYTHON,
    PreparationBudget,
    PreparationError,
    prepare_rowbinary,
)
from dpone.staging.composition import StagingConfig
from dpone.typepolicy import plan_columns
from tests.plugins.staging import make_hostile_db
from tests.plugins.type_samples import bigints, binaries, encode_rows, texts


def _tiny_ranges(monkeypatch: pytest.MonkeyPatch, size: int) -> None:
    """Make the compiled converter split even a small file into many ranges."""
    monkeypatch.setattr(native_conversion, "MIN_RANGE_BYTES", size)
    monkeypatch.setattr(native_conversion, "MAX_RANGE_BYTES", size)


def _no_reference(*args: object, **kwargs: object) -> int:
    raise AssertionError("the compiled converter handed a valid file to the reference")


def test_native_mode_prepares_the_same_spool(tmp_path: Path) -> None:
    make_hostile_db(tmp_path / "src.db")
    exported = export_table(SqliteSource(tmp_path / "src.db"), "hostile", tmp_path / "h.tsv")
    python = prepare_rowbinary(exported.path, exported.receipt, tmp_path / "a")
    fast = prepare_rowbinary(exported.path, exported.receipt, tmp_path / "b", mode=MODE_NATIVE)
    assert fast.path.read_bytes() == python.path.read_bytes()
    assert fast.identity.rowbinary_sha256 == python.identity.rowbinary_sha256
    assert fast.identity.rows_digest == python.identity.rows_digest
    assert python.identity.rows_digest != "0" * 32
    # Same bytes, same identity: the semantic id does not depend on the converter.
    assert (fast.converter, python.converter) == (MODE_NATIVE, MODE_PYTHON)
    assert fast.identity == python.identity and fast.semantic_id == python.semantic_id
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["data.rowbinary"]
    assert oct(os.stat(fast.path).st_mode & 0o777) == "0o400"


def test_native_mode_refusals_name_the_same_position(tmp_path: Path) -> None:
    path = tmp_path / "in.tsv"
    path.write_bytes(b"1\t2020-01-01\n2\t2020-01-02\n")
    loose = SourceSchema.of(
        [SourceColumn("id", "int", False), SourceColumn("d", "nvarchar(20)", True)]
    )
    receipt = validate_file(path, loose)
    strict = SourceSchema.of(
        [SourceColumn("id", "tinyint", False), SourceColumn("d", "date", True)]
    )
    lying = type(receipt)(**{**receipt.__dict__, "schema": strict})
    # Same size, different bytes: refused before conversion.
    path.write_bytes(b"1\t2020-01-01\n2\t1800-01-02\n")
    with pytest.raises(DponeError):
        prepare_rowbinary(path, lying, tmp_path / "x", mode=MODE_NATIVE)
    path.write_bytes(b"1\t2020-01-01\n2\t2020-01-02\n")
    bad = tmp_path / "bad.tsv"
    bad.write_bytes(b"1\t2020-01-01\n2\t1800-01-02\n")
    receipt_bad = validate_file(bad, loose)
    lying_bad = type(receipt_bad)(**{**receipt_bad.__dict__, "schema": lying.schema})
    with pytest.raises(ValueNotRepresentable) as caught:
        prepare_rowbinary(bad, lying_bad, tmp_path / "y", mode=MODE_NATIVE)
    assert (caught.value.details["record"], caught.value.details["column"]) == (2, "d")
    assert not (tmp_path / "y").exists()
    with pytest.raises(PreparationError) as budget:
        prepare_rowbinary(
            path,
            receipt,
            tmp_path / "z",
            mode=MODE_NATIVE,
            budget=PreparationBudget(max_record_bytes=5),
        )
    assert budget.value.code == "record_too_large" and budget.value.details["record"] == 1


def test_native_rows_digest_ignores_row_order_but_not_content(tmp_path: Path) -> None:
    schema = SourceSchema.of(
        [SourceColumn("id", "int", False), SourceColumn("s", "nvarchar(5)", True)]
    )
    plans = plan_columns(schema.columns)
    rows: list[list[Any]] = [[str(i), None if i % 3 == 0 else f"v{i}"] for i in range(50)]
    identities = {}
    files: list[tuple[str, list[list[Any]]]] = [
        ("f", rows),
        ("b", rows[::-1]),
        ("c", [*rows[:-1], ["49", "v48"]]),
    ]
    for name, content in files:
        path = tmp_path / f"{name}.tsv"
        path.write_bytes(encode_rows(plans, content))
        receipt = validate_file(path, schema)
        for mode in (MODE_NATIVE, MODE_PYTHON):
            spool = prepare_rowbinary(path, receipt, tmp_path / f"{name}-{mode}", mode=mode)
            identities[name, mode] = spool.identity
    forward, backward = identities["f", MODE_NATIVE], identities["b", MODE_NATIVE]
    assert forward.rowbinary_sha256 != backward.rowbinary_sha256
    assert forward.rows_digest == backward.rows_digest
    assert identities["c", MODE_NATIVE].rows_digest != forward.rows_digest
    for name in "fbc":
        assert identities[name, MODE_NATIVE] == identities[name, MODE_PYTHON]


def test_a_refusal_or_budget_in_a_later_range_names_the_reference_position(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
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
    for name, mode in (("p", MODE_PYTHON), ("n", MODE_NATIVE)):
        with pytest.raises(ValueNotRepresentable) as caught:
            prepare_rowbinary(path, lying, tmp_path / name, mode=mode)
        errors.append(
            (caught.value.code, caught.value.details["record"], caught.value.details["column"])
        )
        assert not (tmp_path / name).exists()
    assert errors[0] == errors[1] and errors[0][1:] == (151, "d")
    # Budgets the compiled converter cannot name exactly go to the reference, which does.
    for budget, code, record in (
        (PreparationBudget(max_record_bytes=14), "record_too_large", 100),
        (PreparationBudget(max_rows=120), "too_many_records", 121),
        (PreparationBudget(max_spool_bytes=700), "spool_budget_exceeded", None),
    ):
        with pytest.raises(DponeError) as stopped:
            prepare_rowbinary(path, receipt, tmp_path / "y", mode=MODE_NATIVE, budget=budget)
        assert stopped.value.code == code
        if record is not None:
            assert stopped.value.details["record"] == record
        assert not (tmp_path / "y").exists()


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
    _tiny_ranges(monkeypatch, 64)
    schema = SourceSchema.of([SourceColumn("id", "int", False), SourceColumn("d", "date", True)])
    path = tmp_path / "in.tsv"
    path.write_bytes(data)
    refusals = []
    for mode in (MODE_PYTHON, MODE_NATIVE):
        with pytest.raises(DponeError) as caught:
            file_validation.validate_file(path, schema, mode=mode, **budget)  # type: ignore[arg-type]
        details = caught.value.details
        refusals.append(
            (type(caught.value), caught.value.code, details.get("record"), details.get("column"))
        )
    assert refusals[0] == refusals[1]
    assert refusals[0][2] in (41, 42)


def test_a_record_longer_than_the_converter_holds_is_left_to_the_reference(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No record budget, and a record longer than the compiled path keeps in memory:
    # the reference converts the file, with the same result.
    _tiny_ranges(monkeypatch, 16)
    monkeypatch.setattr(preparation, "MAX_CARRY_BYTES", 40)
    schema = SourceSchema.of(
        [SourceColumn("id", "int", False), SourceColumn("t", "nvarchar(max)", True)]
    )
    path = tmp_path / "in.tsv"
    path.write_bytes(b"1\tshort\n2\t" + b"x" * 200 + b"\n3\t\n")
    receipt = validate_file(path, schema)
    python = prepare_rowbinary(path, receipt, tmp_path / "a")
    fast = prepare_rowbinary(path, receipt, tmp_path / "b", mode=MODE_NATIVE)
    assert fast.path.read_bytes() == python.path.read_bytes()
    assert fast.identity == python.identity and fast.identity.prepared_rows == 3


@settings(
    max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(st.tuples(texts, binaries, bigints), min_size=0, max_size=80),
    st.sampled_from([1, 33, 500]),
)
def test_random_files_in_ranges_give_the_reference_identity(
    tmp_path_factory: pytest.TempPathFactory, rows: list[Any], range_bytes: int
) -> None:
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
    receipt = validate_file(path, schema, mode=MODE_PYTHON)
    saved = native_conversion.MIN_RANGE_BYTES, native_conversion.MAX_RANGE_BYTES
    native_conversion.MIN_RANGE_BYTES = native_conversion.MAX_RANGE_BYTES = range_bytes
    try:
        python = prepare_rowbinary(path, receipt, work / "a")
        fast = prepare_rowbinary(path, receipt, work / "b", mode=MODE_NATIVE)
        assert validate_file(path, schema, mode=MODE_NATIVE) == receipt
    finally:
        native_conversion.MIN_RANGE_BYTES, native_conversion.MAX_RANGE_BYTES = saved
    assert fast.path.read_bytes() == python.path.read_bytes()
    assert fast.identity == python.identity


def test_a_non_canonical_field_among_canonical_ones_gives_the_reference_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    schema = SourceSchema.of(
        [
            SourceColumn("d", "decimal(10, 2)", True),
            SourceColumn("f", "float", True),
            SourceColumn("b", "varbinary(8)", True),
        ]
    )
    plans = plan_columns(schema.columns)
    rows = [[f"{i}.25", repr(i + 0.5), bytes([i % 256])] for i in range(200)]
    rows[97] = ["1.5", "100.0", b""]  # plain decimal, whole float, empty binary
    data = encode_rows(plans, rows)
    odd = data.replace(b"\t0a\n", b"\t0A\n", 1)  # capital hex, which exporters never write
    assert odd != data
    _tiny_ranges(monkeypatch, 300)  # about 20 ranges, both workers busy
    for content in (data, odd):
        path = tmp_path / "in.tsv"
        path.write_bytes(content)
        receipt = validate_file(path, schema, mode=MODE_PYTHON)
        python = prepare_rowbinary(path, receipt, tmp_path / "a")
        with monkeypatch.context() as patched:
            patched.setattr(preparation, "convert_records", _no_reference)
            patched.setattr(file_validation, "convert_records", _no_reference)
            fast = prepare_rowbinary(path, receipt, tmp_path / "b", mode=MODE_NATIVE)
            assert file_validation.validate_file(path, schema, mode=MODE_NATIVE) == receipt
        assert fast.path.read_bytes() == python.path.read_bytes()
        assert fast.identity == python.identity
        for spool in (python, fast):
            spool.path.chmod(0o600)
            shutil.rmtree(spool.path.parent)


# ----------------------------------------------------------------------------- what it does not take


WIDE = {"d": "Decimal(40, 2)"}  # wider than the compiled converter's 38 digits


def test_a_wide_decimal_override_is_converted_by_the_reference_with_its_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    schema = SourceSchema.of(
        [SourceColumn("id", "int", False), SourceColumn("d", "decimal(38, 2)", True)]
    )
    plans = plan_columns(schema.columns, WIDE)
    assert not native_conversion.takes(plans)
    path = tmp_path / "in.tsv"
    rows = [[str(i), None if i % 5 == 0 else f"{'9' * 36}.{i % 100:02d}"] for i in range(300)]
    path.write_bytes(encode_rows(plans, rows))
    warned: list[str] = []
    receipt = validate_file(path, schema, overrides=WIDE, warn=warned.append)
    assert receipt == validate_file(path, schema, overrides=WIDE, mode=MODE_PYTHON)
    (warning,) = warned
    assert "does not take Nullable(Decimal(40, 2))" in warning and "Python reference" in warning
    python = prepare_rowbinary(path, receipt, tmp_path / "a", overrides=WIDE)

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("the compiled converter ran on columns it does not take")

    monkeypatch.setattr(rowbinary, "convert_range", never)
    fast = prepare_rowbinary(path, receipt, tmp_path / "b", overrides=WIDE, mode=MODE_NATIVE)
    assert fast.path.read_bytes() == python.path.read_bytes() != b""
    # The reference wrote it: the compiled converter does not take these columns.
    assert fast.identity == python.identity and fast.converter == MODE_PYTHON
    # Without the override the same file is the compiled converter's, with other bytes.
    monkeypatch.undo()
    narrow = prepare_rowbinary(path, receipt, tmp_path / "c", mode=MODE_NATIVE)
    assert narrow.identity.rowbinary_sha256 != fast.identity.rowbinary_sha256


def test_a_refused_value_under_a_wide_override_is_named_by_the_reference(
    tmp_path: Path,
) -> None:
    schema = SourceSchema.of(
        [SourceColumn("id", "int", False), SourceColumn("d", "decimal(38, 2)", True)]
    )
    path = tmp_path / "in.tsv"
    path.write_bytes(b"1\t1.50\n2\t" + b"1" * 39 + b".00\n3\t\n")  # 39 whole digits: too many
    refusals = []
    for mode in (MODE_PYTHON, MODE_NATIVE):
        with pytest.raises(ValueNotRepresentable) as caught:
            validate_file(path, schema, overrides=WIDE, mode=mode)
        refusals.append((caught.value.code, caught.value.details["record"], caught.value.message))
        assert caught.value.details["column"] == "d"
    assert refusals[0] == refusals[1] and refusals[0][1] == 2
    # And preparation (a receipt of a looser schema, as a hand-edited one would be).
    loose = SourceSchema.of(
        [SourceColumn("id", "int", False), SourceColumn("d", "nvarchar(60)", True)]
    )
    receipt = validate_file(path, loose)
    lying = type(receipt)(**{**receipt.__dict__, "schema": schema})
    named = []
    for name, mode in (("p", MODE_PYTHON), ("n", MODE_NATIVE)):
        with pytest.raises(ValueNotRepresentable) as refused:
            prepare_rowbinary(path, lying, tmp_path / name, overrides=WIDE, mode=mode)
        named.append((refused.value.code, refused.value.details["record"]))
        assert not (tmp_path / name).exists()
    assert named[0] == named[1] == (refusals[0][0], 2)


def test_a_refused_value_the_compiled_converter_declines_is_named_by_the_reference(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    schema = SourceSchema.of([SourceColumn("id", "int", False), SourceColumn("d", "date", True)])
    path = tmp_path / "in.tsv"
    path.write_bytes(b"1\t2020-01-01\n2\t2020-02-30\n")
    declined = []
    real = rowbinary.convert_range

    def counted(*args: Any, **kwargs: Any) -> Any:
        part = real(*args, **kwargs)
        declined.append(part is None)
        return part

    monkeypatch.setattr(rowbinary, "convert_range", counted)
    with pytest.raises(ValueNotRepresentable) as caught:
        validate_file(path, schema)
    assert declined == [True]  # the compiled converter saw the file first, and declined it
    assert (caught.value.details["record"], caught.value.details["column"]) == (2, "d")
    assert "record 2, column 'd'" in caught.value.message


# ----------------------------------------------------------------------------- removed modes


def test_the_removed_engine_mode_is_a_typed_error_naming_native(tmp_path: Path) -> None:
    schema = SourceSchema.of([SourceColumn("id", "int", False)])
    path = tmp_path / "in.tsv"
    path.write_bytes(b"1\n2\n")
    receipt = validate_file(path, schema)
    with pytest.raises(PreparationModeRemoved) as prepared:
        prepare_rowbinary(path, receipt, tmp_path / "s", mode="engine-chdb")
    assert not (tmp_path / "s").exists()
    with pytest.raises(PreparationModeRemoved) as validated:
        validate_file(path, schema, mode="engine-chdb")
    with pytest.raises(PreparationModeRemoved) as configured:
        StagingConfig(
            Endpoint("127.0.0.1", 1, 2, "db"),
            Credentials("u", "p"),
            tmp_path,
            preparation_mode="engine-chdb",
        )
    for caught in (prepared, validated, configured):
        assert caught.value.code == "preparation_mode_removed"
        assert dict(caught.value.details) == {"mode": "engine-chdb", "replacement": "native"}
        assert "'native'" in caught.value.message
    # An unknown mode keeps its own error.
    with pytest.raises(PreparationError) as unknown:
        prepare_rowbinary(path, receipt, tmp_path / "s", mode="bogus")
    assert unknown.value.code == "invalid_mode"
